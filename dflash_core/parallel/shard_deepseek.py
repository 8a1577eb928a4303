"""DeepSeek-V3 / Kimi K2 split over ranks: SGLang's tensor-parallel layout for MLA.

Attention splits by head: q_proj / q_b_proj and kv_b_proj are column-parallel (each head's
nope + rope query rows, and its nope key + value rows of the up-projection), o_proj row-parallel
with an all-reduce. The down-projections q_a_proj, kv_a_proj_with_mqa and their norms are
replicated, so every rank computes and caches the full latent (kv_lora_rank + rope per token):
MLA's KV cache does not shrink with tp, unlike Qwen3's per-head K/V, which is why SGLang adds
attention-DP for DeepSeek (each rank then caches only its own requests' latents). Dense layers'
MLPs split as Qwen3's; the MoE keeps its fp32 router replicated, spreads the routed experts over
`ep` groups with expert-internal TP (INT4 experts sliced in whole words and groups along the
intermediate dimension) and splits the shared experts column / row, with one all-reduce for
both.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dflash_core.models.deepseek_config import DeepseekConfig
from dflash_core.models.deepseek_moe import DeepseekMoE
from dflash_core.models.int4 import PACK
from dflash_core.models.mla import MLAttention
from dflash_core.models.target import Target
from dflash_core.parallel.comm import Comm
from dflash_core.parallel.layout import Layout, Span
from dflash_core.parallel.modules import LocalExperts, RowParallelLinear
from dflash_core.parallel.modules_deepseek import LocalInt4Experts, ShardedDeepseekMoE
from dflash_core.parallel.shard_parts import Slice, shard_mlp, shard_vocab


def parallelize_deepseek(target: Target, layout: Layout, comm: Comm) -> dict[str, Slice]:
    """As shard.parallelize, for a DeepSeek target (checked by `layout.check` already)."""
    cfg, rank, slices = target.config, comm.rank, {}
    for i, layer in enumerate(target.model.layers):
        prefix = f"model.layers.{i}"
        slices |= _shard_mla(layer.self_attn, cfg, layout.q_heads(cfg, rank), comm,
                             prefix + ".self_attn")
        if isinstance(layer.mlp, DeepseekMoE):
            layer.mlp, moe_slices = _shard_moe(layer.mlp, cfg, layout, comm, prefix + ".mlp")
            slices |= moe_slices
        else:
            slices |= shard_mlp(layer.mlp, layout.split(cfg.intermediate_size, rank),
                                cfg.hidden_size, comm, prefix + ".mlp")
    return slices | shard_vocab(target, layout, comm)


def _shard_mla(attn: MLAttention, cfg: DeepseekConfig, heads: Span, comm: Comm,
               prefix: str) -> dict[str, Slice]:
    """Heads `heads` of every head-major projection; the latent's projections stay whole."""
    q_width = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim  # rows per head of q
    kv_width = cfg.qk_nope_head_dim + cfg.v_head_dim  # rows per head of kv_b
    q_name, q_in = (("q_proj", cfg.hidden_size) if cfg.q_lora_rank is None
                    else ("q_b_proj", cfg.q_lora_rank))
    attn.heads = heads.count
    setattr(attn, q_name, nn.Linear(q_in, heads.count * q_width, bias=False))
    attn.kv_b_proj = nn.Linear(cfg.kv_lora_rank, heads.count * kv_width, bias=False)
    attn.o_proj = RowParallelLinear(heads.count * cfg.v_head_dim, cfg.hidden_size, comm)
    return {f"{prefix}.{q_name}.weight": Slice(0, _rows(heads, q_width)),
            f"{prefix}.kv_b_proj.weight": Slice(0, _rows(heads, kv_width)),
            f"{prefix}.o_proj.weight": Slice(1, _rows(heads, cfg.v_head_dim))}


def _shard_moe(moe: DeepseekMoE, cfg: DeepseekConfig, layout: Layout, comm: Comm,
               prefix: str) -> tuple[ShardedDeepseekMoE, dict[str, Slice]]:
    rank, hidden = comm.rank, cfg.hidden_size
    span, inner = layout.experts(cfg, rank), layout.expert_intermediate(cfg, rank)
    quant = cfg.quantization
    experts = (LocalExperts(span, hidden, inner) if quant is None
               else LocalInt4Experts(span, hidden, inner, quant.group_size))
    slices = {}
    if moe.shared_experts is not None:
        slices = shard_mlp(moe.shared_experts, layout.split(cfg.shared_intermediate_size, rank),
                           hidden, None, prefix + ".shared_experts")
    return ShardedDeepseekMoE(moe.gate, experts, moe.shared_experts, comm), slices


def _rows(heads: Span, per_head: int) -> Span:
    return Span(heads.start * per_head, heads.count * per_head)


def read_int4_experts(reader, experts: LocalInt4Experts, prefix: str, leaf: str) -> Tensor:
    """A stacked buffer of this rank's INT4 experts from their per-expert checkpoint tensors:
    gate_up_{packed,scale} [E_local, 2 I_local, H / 8 or H / group] (each expert's gate rows then
    up rows), down_{packed,scale} [E_local, H, I_local / 8 or I_local / group] (its columns,
    eight values a packed word, `group` a scale)."""
    stack, _, part = leaf.rpartition("_")  # "gate_up" | "down", "packed" | "scale"
    suffix, inner, ids = f"weight_{part}", experts.slice, range(experts.span.start,
                                                                 experts.span.stop)
    if stack == "down":
        per = PACK if part == "packed" else experts.group  # intermediate values per column
        columns = Slice(1, Span(inner.start // per, inner.count // per))
        return torch.stack([reader.read(f"{prefix}.{e}.down_proj.{suffix}", columns)
                            for e in ids])
    return torch.stack([torch.cat([reader.read(f"{prefix}.{e}.{name}.{suffix}", Slice(0, inner))
                                   for name in ("gate_proj", "up_proj")]) for e in ids])
