"""A target split over ranks at load time: each rank builds the model on the meta device, swaps
in its shards (modules.py) and reads only its slices of the safetensors, so no rank ever holds
the full weights. The drafter is small and stays replicated (load_drafter as usual)."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn

from dflash_core.models.architectures import target_config
from dflash_core.models.attention import Attention
from dflash_core.models.config import CheckpointError, ModelConfig, read_config
from dflash_core.models.layers import MLP, MoE
from dflash_core.models.loader import check_shapes, checkpoint_files, expected_shapes
from dflash_core.models.target import Target
from dflash_core.parallel.comm import Comm
from dflash_core.parallel.layout import Layout, Span
from dflash_core.parallel.modules import (
    RowParallelLinear,
    ShardedExperts,
    VocabParallelEmbedding,
    VocabParallelHead,
)


@dataclass(slots=True, frozen=True)
class Slice:
    """Rows (dim 0) or columns (dim 1) `span` of a checkpoint tensor."""

    dim: int
    span: Span


def load_sharded_target(directory: str | Path, layout: Layout, comm: Comm,
                        dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu") -> Target:
    config = shardable_config(directory)
    with CheckpointReader(directory) as reader:
        with torch.device("meta"):
            target = Target(config)
            found = dict(reader.shapes)
            if config.tie_word_embeddings:
                found.pop("lm_head.weight", None)  # some exporters keep a copy of the tied head
            check_shapes(expected_shapes(target), found)
            slices = parallelize(target, layout, comm)
        target = _materialize(target, dtype, device)
        with torch.no_grad():
            for name, param in target.named_parameters():
                param.copy_(_read_param(reader, target, name, slices))
    return target.eval()


def shardable_config(directory: str | Path) -> ModelConfig:
    """The target's config, or a CheckpointError when its architecture cannot be split here:
    only Qwen3 (dense and MoE) has shard modules, not DeepSeek-V3 / Kimi K2's MLA."""
    config = target_config(read_config(directory))
    if not isinstance(config, ModelConfig):
        raise CheckpointError(f"{directory} is a DeepSeek-V3 / Kimi K2 (MLA) target: tensor / "
                              "expert parallelism (tp > 1) supports Qwen3 targets only; run it "
                              "with tp 1")
    return config


def parallelize(target: Target, layout: Layout, comm: Comm) -> dict[str, Slice]:
    """Put this rank's shards in place of `target`'s modules (shapes only: new parameters are
    uninitialised) -> parameter name -> the slice of its checkpoint tensor it holds."""
    cfg, rank, slices = target.config, comm.rank, {}
    layout.check(cfg)
    for i, layer in enumerate(target.model.layers):
        prefix = f"model.layers.{i}"
        slices |= _shard_attention(layer.self_attn, cfg, layout, rank, comm, prefix + ".self_attn")
        layer.mlp, mlp_slices = _shard_mlp(layer.mlp, cfg, layout, rank, comm, prefix + ".mlp")
        slices |= mlp_slices
    vocab = layout.split(cfg.vocab_size, rank)
    target.model.embed_tokens = VocabParallelEmbedding(vocab, cfg.hidden_size, comm)
    target.lm_head = VocabParallelHead(vocab, cfg.hidden_size, comm)
    slices["model.embed_tokens.weight"] = slices["lm_head.weight"] = Slice(0, vocab)
    if cfg.tie_word_embeddings:
        target.lm_head.weight = target.model.embed_tokens.weight
    target.comm = comm
    return slices


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


def _shard_mlp(mlp: nn.Module, cfg: ModelConfig, layout: Layout, rank: int, comm: Comm,
               prefix: str) -> tuple[nn.Module, dict[str, Slice]]:
    if isinstance(mlp, MoE):
        mlp.experts = ShardedExperts(layout.experts(cfg, rank), cfg.hidden_size,
                                     layout.expert_intermediate(cfg, rank), comm)
        return mlp, {}
    assert isinstance(mlp, MLP)
    inner = layout.split(cfg.intermediate_size, rank)
    mlp.gate_proj = nn.Linear(cfg.hidden_size, inner.count, bias=False)
    mlp.up_proj = nn.Linear(cfg.hidden_size, inner.count, bias=False)
    mlp.down_proj = RowParallelLinear(inner.count, cfg.hidden_size, comm)
    return mlp, {f"{prefix}.gate_proj.weight": Slice(0, inner),
                 f"{prefix}.up_proj.weight": Slice(0, inner),
                 f"{prefix}.down_proj.weight": Slice(1, inner)}


def _materialize(target: Target, dtype: torch.dtype, device: str | torch.device) -> Target:
    target = target.to(dtype).to_empty(device=device)
    if target.config.tie_word_embeddings:  # to_empty makes new parameters: tie them again
        target.lm_head.weight = target.model.embed_tokens.weight
    return target


def _read_param(reader: CheckpointReader, target: Target, name: str,
                slices: dict[str, Slice]) -> Tensor:
    owner, _, leaf = name.rpartition(".")
    module = target.get_submodule(owner)
    if isinstance(module, ShardedExperts):
        return _read_experts(reader, module, owner, leaf)
    return reader.read(name, slices.get(name))


def _read_experts(reader: CheckpointReader, experts: ShardedExperts, prefix: str,
                  leaf: str) -> Tensor:
    """The stacked [E_local, 2I_local, H] gate_up or [E_local, H, I_local] down weights."""
    inner, ids = experts.slice, range(experts.span.start, experts.span.stop)
    if leaf == "down_proj":
        return torch.stack([reader.read(f"{prefix}.{e}.down_proj.weight", Slice(1, inner))
                            for e in ids])
    return torch.stack([torch.cat([reader.read(f"{prefix}.{e}.{name}.weight", Slice(0, inner))
                                   for name in ("gate_proj", "up_proj")]) for e in ids])


class CheckpointReader:
    """Reads slices of a checkpoint's tensors without loading the rest (safetensors mmaps)."""

    def __init__(self, directory: str | Path) -> None:
        self.files = checkpoint_files(directory)
        self._stack = ExitStack()
        self._where: dict[str, object] = {}

    def __enter__(self) -> CheckpointReader:
        for path in self.files:
            handle = self._stack.enter_context(safe_open(str(path), framework="pt"))
            self._where.update(dict.fromkeys(handle.keys(), handle))
        self.shapes = {k: tuple(h.get_slice(k).get_shape()) for k, h in self._where.items()}
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def read(self, key: str, part: Slice | None = None) -> Tensor:
        view = self._where[key].get_slice(key)
        if part is None:
            return view[:]
        span = slice(part.span.start, part.span.stop)
        return view[span] if part.dim == 0 else view[:, span]
