"""Checkpoints in the public layouts: HF Qwen3 targets and DFlash drafters (safetensors).

Targets: ``config.json`` + ``model.safetensors`` or a sharded ``model.safetensors.index.json``.
Drafters: ``config.json`` (with ``block_size`` and ``dflash_config``) + ``model.safetensors``
holding ``fc``, ``hidden_norm``, ``norm`` and ``layers.{i}.*`` with no ``model.`` prefix and no
embedding or LM head. A checkpoint that does not fit is refused with a CheckpointError naming the
key, the shapes or the mismatched size.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from dflash_core.models.config import CheckpointError, DrafterConfig, ModelConfig, read_config
from dflash_core.models.drafter import Drafter
from dflash_core.models.target import Target

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def load_target(directory: str | Path, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> Target:
    config = ModelConfig.from_dict(read_config(directory))
    return _load_into(Target(config), read_weights(directory), dtype, device)


def load_drafter(directory: str | Path, target: ModelConfig | None = None,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> Drafter:
    config = DrafterConfig.from_dict(read_config(directory))
    if target is not None:
        config.check_target(target)
    return _load_into(Drafter(config), read_weights(directory), dtype, device)


def save_model(model: Target | Drafter, directory: str | Path) -> None:
    """Write config.json + model.safetensors in the public layout (tied LM head left out)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2))
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if isinstance(model, Target) and model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    save_file(state, str(out / SINGLE_FILE))


def read_weights(directory: str | Path) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = {}
    for path in checkpoint_files(directory):
        weights.update(_read_file(path))
    return weights


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
    return sorted(set(weight_map.values()))


def _read_file(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path} is not a readable safetensors file: {error}") from None


def _load_into(model: nn.Module, weights: dict[str, torch.Tensor], dtype: torch.dtype,
               device: str | torch.device) -> nn.Module:
    if isinstance(model, Target) and model.config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)  # some exporters keep a copy of the tied head
    check_shapes(expected_shapes(model), {k: tuple(v.shape) for k, v in weights.items()})
    model.load_state_dict(weights, strict=False)  # tied lm_head is filled through the embedding
    return model.to(device=device, dtype=dtype).eval()


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
    if isinstance(model, Target) and model.config.tie_word_embeddings:
        shapes.pop("lm_head.weight")
    return shapes
