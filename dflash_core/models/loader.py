"""Checkpoints in the public layouts: HF Qwen3 and DeepSeek-V3 / Kimi K2 targets and DFlash
drafters (safetensors).

Targets: ``config.json`` + ``model.safetensors`` or a sharded ``model.safetensors.index.json``.
Drafters: ``config.json`` (with ``block_size`` and ``dflash_config``) + ``model.safetensors``
holding ``fc``, ``hidden_norm``, ``norm`` and ``layers.{i}.*`` with no ``model.`` prefix and no
embedding or LM head. A checkpoint that does not fit is refused with a CheckpointError naming the
key, the shapes or the mismatched size.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from dflash_core.models.architectures import (
    TargetConfig,
    build_target,
    target_config,
    target_key_map,
)
from dflash_core.models.config import CheckpointError, DrafterConfig, read_config
from dflash_core.models.drafter import Drafter
from dflash_core.models.layers import fuse_projections
from dflash_core.models.lazy_weights import LazyWeights
from dflash_core.models.target import Target

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def load_target(directory: str | Path, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> Target:
    """Qwen3 (dense / MoE) or DeepSeek-V3 / Kimi K2, as its config.json says."""
    config = target_config(read_config(directory))
    weights = read_weights(directory)
    weights = weights.renamed(target_key_map(config, list(weights)))
    return _load_into(lambda: build_target(config), weights, dtype, device)


def load_drafter(directory: str | Path, target: TargetConfig | None = None,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> Drafter:
    config = DrafterConfig.from_dict(read_config(directory))
    if target is not None:
        config.check_target(target)
    return _load_into(lambda: Drafter(config), read_weights(directory), dtype, device)


def save_model(model: Target | Drafter, directory: str | Path, shards: int = 1) -> None:
    """Write config.json + model.safetensors in the public layout (tied LM head left out), or
    with shards > 1 that many model-0000i-of-0000n.safetensors and their index."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2))
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if isinstance(model, Target) and model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    if shards == 1:
        save_file(state, str(out / SINGLE_FILE))
        return
    keys = list(state)  # in module order, so a layer's tensors share a shard
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map = {k: names[i * shards // len(keys)] for i, k in enumerate(keys)}
    for name in names:
        save_file({k: state[k] for k in keys if weight_map[k] == name}, str(out / name))
    total = sum(v.numel() * v.element_size() for v in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2))


def read_weights(directory: str | Path) -> LazyWeights:
    """The checkpoint's tensors by name (headers read now, data when copied)."""
    return LazyWeights.open(checkpoint_files(directory))


def checkpoint_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint (one, or the shards its index lists)."""
    root = Path(directory)
    if (root / INDEX_FILE).is_file():
        files = [root / name for name in _shard_names(root / INDEX_FILE)]
    elif (root / SINGLE_FILE).is_file():
        files = [root / SINGLE_FILE]
    else:
        raise CheckpointError(f"{root} has neither {SINGLE_FILE} nor {INDEX_FILE}")
    missing = [path.name for path in files if not path.is_file()]
    if missing:
        raise CheckpointError(f"shard {missing[0]} listed in the index is missing")
    return files


def _shard_names(index: Path) -> list[str]:
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (json.JSONDecodeError, AttributeError) as error:
        raise CheckpointError(f"{index} is not a valid index: {error}") from None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index} has no weight_map")
    names = set(weight_map.values())
    root = index.parent.resolve()
    for name in names:  # a shard is a file of the checkpoint, never one elsewhere on the disk
        if not isinstance(name, str) or not (root / name).resolve().is_relative_to(root):
            raise CheckpointError(f"{index}: shard {name!r} is not a file inside {index.parent}; "
                                  "a weight_map lists the checkpoint's own files")
    return sorted(names)


def _load_into(build: Callable[[], nn.Module], weights: LazyWeights, dtype: torch.dtype,
               device: str | torch.device) -> nn.Module:
    """The model built straight in `dtype` on `device`, checked against the checkpoint's
    headers, then filled tensor by tensor (its state dict's entries are views of its storage:
    per-expert keys are slices of the stacked experts), its projections fused (layers.py)."""
    model = _built(build, dtype, device)
    names = set(weights) - _tied_head(model)  # some exporters keep a copy of the tied head
    check_shapes(expected_shapes(model), {key: weights.shape(key) for key in names})
    state = model.state_dict()
    with torch.no_grad():
        weights.each(names, lambda key, tensor: _fill(key, state[key], tensor))
    return fuse_projections(model.eval())  # a loaded model serves: one GEMM per group


def _fill(key: str, slot: torch.Tensor, tensor: torch.Tensor) -> None:
    """Copy a checkpoint tensor into the model's storage (`slot` is a view of it)."""
    if key.endswith(".weight_shape"):  # INT4 metadata: a value to check, not a weight to copy
        if tensor.tolist() != slot.tolist():
            raise CheckpointError(f"{key}: {tensor.tolist()} != the model's {slot.tolist()}")
        return
    slot.copy_(tensor)


def _built(build: Callable[[], nn.Module], dtype: torch.dtype,
           device: str | torch.device) -> nn.Module:
    """Parameters allocated once, in their final dtype and place (no float32 CPU copy first)."""
    with allocating(dtype, device):
        return build()


@contextmanager
def allocating(dtype: torch.dtype, device: str | torch.device):
    """New modules' parameters in `dtype` on `device` (those a module pins, such as the DeepSeek
    router's fp32, keep theirs); "meta" builds shapes only."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def _tied_head(model: nn.Module) -> set[str]:
    tied = isinstance(model, Target) and model.config.tie_word_embeddings
    return {"lm_head.weight"} if tied else set()


def check_shapes(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]]) -> None:
    """A CheckpointError naming a missing or unexpected key, or a shape that does not fit."""
    missing = sorted(set(expected) - set(found))
    if missing:
        raise CheckpointError(f"checkpoint lacks {len(missing)} key(s), e.g. {missing[0]!r}")
    unexpected = sorted(set(found) - set(expected))
    if unexpected:
        raise CheckpointError(f"checkpoint has unexpected key(s), e.g. {unexpected[0]!r}")
    for key, shape in expected.items():
        if tuple(found[key]) != shape:
            raise CheckpointError(f"{key}: checkpoint shape {tuple(found[key])} != "
                                  f"model shape {shape}")


def expected_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Key -> shape of every weight a checkpoint of `model` holds (a meta-device model will do)."""
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for key in _tied_head(model):
        shapes.pop(key)
    return shapes
