"""A target split over ranks at load time: each rank builds the model on the meta device, swaps
in its shards (modules.py, modules_deepseek.py) and reads only its slices of the safetensors, so
no rank ever holds the full weights. `parallelize` picks the plan by architecture: Qwen3's here,
DeepSeek-V3 / Kimi K2's (MLA) in shard_deepseek.py. The drafter is small and stays replicated
(load_drafter as usual)."""

from __future__ import annotations

from contextlib import ExitStack
from itertools import chain
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn

from dflash_core.models.architectures import TargetConfig, build_target, target_config
from dflash_core.models.architectures import target_key_map
from dflash_core.models.attention import Attention
from dflash_core.models.config import ModelConfig, read_config
from dflash_core.models.deepseek_config import DeepseekConfig
from dflash_core.models.layers import MLP, MoE, fuse_projections
from dflash_core.models.loader import allocating, check_shapes, checkpoint_files
from dflash_core.models.loader import expected_shapes
from dflash_core.models.target import Target
from dflash_core.parallel.comm import Comm
from dflash_core.parallel.layout import Layout, Span
from dflash_core.parallel.modules import LocalExperts, RowParallelLinear, ShardedExperts
from dflash_core.parallel.modules_deepseek import LocalInt4Experts
from dflash_core.parallel.shard_deepseek import parallelize_deepseek, read_int4_experts
from dflash_core.parallel.shard_parts import Slice, shard_mlp, shard_vocab


def load_sharded_target(directory: str | Path, layout: Layout, comm: Comm,
                        dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu") -> Target:
    config = checked_config(directory, layout)
    with CheckpointReader(directory, config) as reader:
        with allocating(dtype, "meta"):  # dtypes a module pins (the fp32 router) stay
            target = build_target(config)
            found = dict(reader.shapes)
            if config.tie_word_embeddings:
                found.pop("lm_head.weight", None)  # some exporters keep a copy of the tied head
            check_shapes(expected_shapes(target), found)
            slices = parallelize(target, layout, comm)
        target = _materialize(target, device)
        with torch.no_grad():
            for name, tensor in chain(target.named_parameters(), target.named_buffers()):
                tensor.copy_(_read_tensor(reader, target, name, slices))
    return fuse_projections(target.eval())  # each rank's slices, as a loaded model is


def checked_config(directory: str | Path, layout: Layout) -> TargetConfig:
    """The target's config, or a CheckpointError naming the first dimension `layout` cannot
    split (Ranks calls this before it starts any rank)."""
    config = target_config(read_config(directory))
    layout.check(config)
    return config


def parallelize(target: Target, layout: Layout, comm: Comm) -> dict[str, Slice]:
    """Put this rank's shards in place of `target`'s modules (shapes only: new parameters are
    uninitialised) -> parameter name -> the slice of its checkpoint tensor it holds."""
    layout.check(target.config)
    return _PLANS[type(target.config)](target, layout, comm)


def _parallelize_qwen3(target: Target, layout: Layout, comm: Comm) -> dict[str, Slice]:
    cfg, rank, slices = target.config, comm.rank, {}
    for i, layer in enumerate(target.model.layers):
        prefix = f"model.layers.{i}"
        slices |= _shard_attention(layer.self_attn, cfg, layout, rank, comm, prefix + ".self_attn")
        if isinstance(layer.mlp, MoE):
            layer.mlp.experts = ShardedExperts(layout.experts(cfg, rank), cfg.hidden_size,
                                               layout.expert_intermediate(cfg, rank), comm)
        else:
            assert isinstance(layer.mlp, MLP)
            slices |= shard_mlp(layer.mlp, layout.split(cfg.intermediate_size, rank),
                                cfg.hidden_size, comm, prefix + ".mlp")
    return slices | shard_vocab(target, layout, comm)


def _shard_attention(attn: Attention, cfg: ModelConfig, layout: Layout, rank: int, comm: Comm,
                     prefix: str) -> dict[str, Slice]:
    q, kv, d = layout.q_heads(cfg, rank), layout.kv_heads(cfg, rank), cfg.head_dim
    attn.n_heads, attn.n_kv = q.count, kv.count
    attn.q_proj = nn.Linear(cfg.hidden_size, q.count * d, bias=False)
    attn.k_proj = nn.Linear(cfg.hidden_size, kv.count * d, bias=False)
    attn.v_proj = nn.Linear(cfg.hidden_size, kv.count * d, bias=False)
    attn.o_proj = RowParallelLinear(q.count * d, cfg.hidden_size, comm)
    q_rows, kv_rows = Span(q.start * d, q.count * d), Span(kv.start * d, kv.count * d)
    return {f"{prefix}.q_proj.weight": Slice(0, q_rows),
            f"{prefix}.k_proj.weight": Slice(0, kv_rows),
            f"{prefix}.v_proj.weight": Slice(0, kv_rows),
            f"{prefix}.o_proj.weight": Slice(1, q_rows)}


_PLANS = {ModelConfig: _parallelize_qwen3, DeepseekConfig: parallelize_deepseek}


def _materialize(target: Target, device: str | torch.device) -> Target:
    target = target.to_empty(device=device)
    if target.config.tie_word_embeddings:  # to_empty makes new parameters: tie them again
        target.lm_head.weight = target.model.embed_tokens.weight
    return target


def _read_tensor(reader: CheckpointReader, target: Target, name: str,
                 slices: dict[str, Slice]) -> Tensor:
    owner, _, leaf = name.rpartition(".")
    module = target.get_submodule(owner)
    read_stack = _STACKED_READERS.get(type(module))
    if read_stack is not None:
        return read_stack(reader, module, owner, leaf)
    return reader.read(name, slices.get(name))


def _read_experts(reader: CheckpointReader, experts: LocalExperts, prefix: str,
                  leaf: str) -> Tensor:
    """The stacked [E_local, 2I_local, H] gate_up or [E_local, H, I_local] down weights."""
    inner, ids = experts.slice, range(experts.span.start, experts.span.stop)
    if leaf == "down_proj":
        return torch.stack([reader.read(f"{prefix}.{e}.down_proj.weight", Slice(1, inner))
                            for e in ids])
    return torch.stack([torch.cat([reader.read(f"{prefix}.{e}.{name}.weight", Slice(0, inner))
                                   for name in ("gate_proj", "up_proj")]) for e in ids])


# Experts stacked [E, ...] in the model, one tensor per expert in the checkpoint.
_STACKED_READERS = {ShardedExperts: _read_experts, LocalExperts: _read_experts,
                    LocalInt4Experts: read_int4_experts}


class CheckpointReader:
    """Reads slices of a checkpoint's tensors by their names in the model (the architecture's
    key map: the K2.5 wrapper's prefix) without loading the rest (safetensors mmaps)."""

    def __init__(self, directory: str | Path, config: TargetConfig) -> None:
        self.files, self.config = checkpoint_files(directory), config
        self._stack = ExitStack()
        self._where: dict[str, object] = {}

    def __enter__(self) -> CheckpointReader:
        for path in self.files:
            handle = self._stack.enter_context(safe_open(str(path), framework="pt"))
            self._where.update(dict.fromkeys(handle.keys(), handle))
        self._keys = target_key_map(self.config, list(self._where))  # model name -> key
        self.shapes = {name: tuple(self._view(name).get_shape()) for name in self._keys}
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def read(self, name: str, part: Slice | None = None) -> Tensor:
        view = self._view(name)
        if part is None:
            return view[:]
        span = slice(part.span.start, part.span.stop)
        return view[span] if part.dim == 0 else view[:, span]

    def _view(self, name: str):
        key = self._keys[name]
        return self._where[key].get_slice(key)
