"""Each component of a forward, from the node's measured kernel tables or the roofline.

A component (the dense GEMMs, the routed experts, attention, the collectives) is a ``Term``: its
time, where the time comes from (``measured``: interpolated in the kernel tables of this GPU
and engine; ``roofline``: bytes over achieved bandwidth or FLOPs over achieved throughput, with
the fitted efficiencies, where no table covers the shape; ``fitted``: a constant no kernel table
holds, such as host time), and its speed of light: the datasheet's bandwidth, FLOP/s or link
speed at 100%, without fixed costs. ``sol_pct`` is the share of the time the hardware's limit
accounts for: how much is left to gain in that component.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache

from backends.perf_model.catalog import BF16_BYTES, FP32_BYTES, Hardware, ModelArch
from backends.perf_model.kernels.tables import BF16, KernelTables
from backends.perf_model.node import Node
from backends.perf_model.shapes import FP8, Linear
from backends.perf_model.traffic import Collectives

MEASURED, ROOFLINE, FITTED = "measured", "roofline", "fitted"
# Attention timed with a bf16 KV cache, standing in for an 8-bit cache no table times.
BF16_KV = "measured-bf16-kv"
# Routed-expert weights by bits a weight -> the MoE table dtype that runs them: Marlin W4A16
# for INT4 checkpoints with group scales (Kimi K2.6), block-scaled FP8, bf16.
_MOE_DTYPES = ((5.0, "int4_wo"), (8.0, "fp8_block"), (16.0, "bfloat16"))
# MXFP4 experts (Kimi-K3, gpt-oss): the weight-only kernel where the engine's tables time it
# (Marlin / FlashInfer W4A16), else its MXFP4 x MXFP8 kernel.
_MXFP4_DTYPES = ("w4a16_mxfp4", "w4a8_mxfp4_mxfp8")
# The KDA kernels a layer runs, by engine family and phase (kda_perf tables): in order of
# preference, each a set of kernels whose times add; SGLang's split decode kernels were timed
# for some head counts only, its fused one for the others.
_KDA_KERNELS = {
    ("sglang", "generation"): (("fused_recurrent_kda_packed_decode", "causal_conv1d_update"),
                               ("kda_fused_decode",)),
    ("sglang", "verify"): (("fused_kda_decode_mtp_dspark",),),
    ("sglang", "context"): (("causal_conv1d_fn_qkv3", "chunk_kda"),),
    ("vllm", "generation"): (("fused_kda_decode",),
                             ("fused_recurrent_kda_packed_decode", "causal_conv1d_update")),
    ("vllm", "verify"): (("causal_conv1d_update", "fused_recurrent_kda"),),
    ("vllm", "context"): (("causal_conv1d_fn_qkv3", "flashkda_fwd"),),
}
# FLOPs of one token through one KDA head, per head_dim^2: reading the state against the query
# and the key, the delta-rule rank-one update, the decay (a few passes over the state).
KDA_FLOPS_PER_STATE = 8
# The engines' own one-shot / two-shot all-reduce, unless disabled (disable_custom_all_reduce):
# vLLM uses it only where every GPU pair has NVLink or there are just two GPUs (NCCL on more
# PCIe GPUs); SGLang also on PCIe GPUs with peer-to-peer access (its tables time it on 8 PCIe
# GPUs). Either only for messages up to its buffer (8 MiB of bf16).
CUSTOM_ALL_REDUCE_MAX_ELEMENTS = 4 * 1024 * 1024


@dataclass(slots=True, frozen=True)
class Term:
    ms: float
    source: str  # MEASURED | ROOFLINE | FITTED, or several joined by "+"
    sol_ms: float = 0.0

    @property
    def sol_pct(self) -> float | None:
        return 100.0 * self.sol_ms / self.ms if self.sol_ms and self.ms else None


def total(terms: Iterable[Term]) -> Term:
    """Several terms as one: their times and speeds of light add; the sources of the nonzero
    ones are joined ("measured+fitted")."""
    terms = list(terms)
    return Term(sum(t.ms for t in terms), _sources(terms), sum(t.sol_ms for t in terms))


def concurrent(a: Term, b: Term) -> Term:
    """Two terms on two CUDA streams at once: the longer of them, but never faster than both
    together at the speed of light (they share the memory and the SMs)."""
    sol = a.sol_ms + b.sol_ms
    return Term(max(a.ms, b.ms, sol), _sources([a, b]), sol)


def _sources(terms: list[Term]) -> str:
    return "+".join(sorted({part for t in terms if t.ms for part in t.source.split("+")})) \
        or MEASURED


def fitted(ms: float) -> Term:
    return Term(ms, FITTED)


def gemms(node: Node, linears: Iterable[Linear], rows: int, tp: int,
          rows_of: dict[str, int] | None = None) -> Term:
    """The dense GEMMs of one forward on one of ``tp`` ranks, ``rows`` tokens tall (a linear
    named in ``rows_of`` runs that many rows instead)."""
    parts = []
    for lin in linears:
        m = (rows_of or {}).get(lin.name, rows)
        n, k = lin.on_rank(tp)
        nbytes = n * k * (1 if lin.dtype == FP8 else BF16_BYTES)
        flops = 2.0 * m * n * k
        sol = node.sol_ms(nbytes, flops) * lin.per_forward
        ms = (_absorbed_table(node.kernels, m, lin.heads // tp or 1, lin.dtype) if lin.heads
              else _gemm_table(node.kernels, m, n, k, lin.dtype))
        if ms is not None:
            parts.append(Term(ms * lin.per_forward, MEASURED, sol))
        else:
            each = node.linear_ms(nbytes, flops, m) + node.eff.matmul_fixed_us / 1e3
            parts.append(Term(each * lin.per_forward, ROOFLINE, sol))
    return total(parts)


def _gemm_table(tables: KernelTables | None, m: int, n: int, k: int, dtype: str) -> float | None:
    if tables is None:
        return None
    # FP8 checkpoints are block-scaled; where only per-tensor FP8 was timed, that kernel stands in.
    for name in (("fp8_block", "fp8") if dtype == FP8 else (dtype,)):
        ms = tables.gemm_ms(m, n, k, name)
        if ms is not None:
            return ms
    return None


def _absorbed_table(tables: KernelTables | None, rows: int, heads: int,
                    dtype: str) -> float | None:
    """MLA's absorbed kv_b: queries into the latent, then the latent out to values, per head."""
    if tables is None:
        return None
    parts = [tables.mla_bmm_ms(op, rows, heads, dtype) for op in ("mla_gen_pre", "mla_gen_post")]
    return None if None in parts else sum(parts)


def decode_attention(node: Node, layers: int, heads: int, kv_heads: int, head_dim: int,
                     batch: int, queries: int, context: float, roofline: Term,
                     kv_dtype: str = BF16) -> Term:
    """Attention of ``batch`` requests, ``queries`` new tokens each (1 for plain decoding, the
    verify width or the draft block when speculating), over their ``context`` tokens cached in
    ``kv_dtype`` (``timed_kv``), on one rank holding ``heads`` query heads and ``kv_heads`` KV
    heads (0: MLA's shared latent).

    The tables time one query token a request. Several queries of one request share its K/V
    exactly as several query heads of a KV head do, and decode kernels fold them the same way
    (queries x heads rows against one read of the cache), so ``queries`` tokens of ``heads``
    heads are looked up as one token of ``queries x heads`` heads. Each query also sees the
    step's new positions (the tree or causal mask hides some, the kernel reads them all), so
    the cache read is ``context + queries`` long. GQA query heads past the widest timed cost
    the table's widest time or their FLOPs at the compute rate, whichever is more (a tile per
    KV head reads its cache once, however many query heads it folds); MLA's heads are tiled
    in fixed groups that each read the latent, so its time grows with them."""
    t, kv_len, rows = node.kernels, context + queries, heads * queries
    if t is None:
        return roofline
    if kv_heads == 0:
        return _per_layer(timed_kv(lambda kv: t.mla_generation_ms(batch, rows, kv_len, kv),
                                   kv_dtype), layers, roofline)
    ms, source = timed_kv(lambda kv: t.attention_generation_ms(batch, rows, kv_heads, head_dim,
                                                                kv_len, kv), kv_dtype)
    if ms is not None:  # QK and PV: 2 FLOPs a multiply-add, 2 products a cached position
        ms = max(ms, node.compute_ms(4.0 * batch * rows * kv_len * head_dim, math.inf))
    return _per_layer((ms, source), layers, roofline)


def timed_kv(lookup: Callable[[str], float | None], kv_dtype: str) -> tuple[float | None, str]:
    """An attention lookup (by the tables' KV cache type: bfloat16, fp8) for a ``kv_dtype``
    cache, and its source. Where the tables time no cache of that type, the bf16 cache's time
    stands in (source BF16_KV): across the GPUs and engines timed, an 8-bit cache's kernel
    runs anywhere from twice as fast as the bf16 one (long contexts, large batches) to several
    times slower (some engines' MLA kernels), so the 8-bit cache is credited with its capacity
    (memory.py) and not with a guessed kernel speed."""
    ms = lookup(kv_dtype)
    if ms is None and kv_dtype != BF16:
        return lookup(BF16), BF16_KV
    return ms, MEASURED


# The weight matrices of an MLA block that vLLM's MLA module tables time with its attention.
MLA_BLOCK_LINEARS = frozenset({"qkv_a_proj", "q_proj", "kv_a_proj", "q_b_proj", "kv_b_proj",
                               "o_proj"})
_SHORTEST_CONTEXT = 2  # the module tables' first cached length: a block with next to no KV


def mla_block(node: Node, m: ModelArch, heads: int, batch: int, rows: int, queries: int,
              context: float, prompt: bool, dcp: int = 1, kv_dtype: str = BF16) -> Term | None:
    """vLLM's MLA blocks (MLA_BLOCK_LINEARS and the absorbed attention) of every attention
    layer on a rank of ``heads`` heads, from its MLA module tables, where they time this
    model's block (DeepSeek-V3's geometry, any head count); None elsewhere. Decode: ``batch``
    requests of ``queries`` tokens each (``rows`` with graph padding) over ``context``. The
    tables time one query a request, so a step is the block at ``rows`` single queries with
    next to no KV (its GEMMs and fixed cost, once a row) plus what the context adds for
    ``batch`` requests (each request's KV read once for all its queries). Under decode context
    parallelism a rank attends for the heads of ``dcp`` ranks over a ``dcp``-th of the
    context. ``prompt``: ``batch`` whole prompts of ``queries`` tokens. ``kv_dtype``: the
    cache's element type, as in ``decode_attention``."""
    t = node.kernels
    if t is None or t.engine != "vllm" or not _deepseek_mla(m):
        return None
    dtype = "fp8_block" if m.dense_weight_bits <= 8 else "bfloat16"

    def module(queries_timed: int, heads_timed: int, length: float, kv: str) -> float | None:
        return t.mla_module_ms(queries_timed, heads_timed, length, dtype, prompt, kv)

    def block(kv: str) -> float | None:
        if prompt:
            return module(batch, heads, queries, kv)
        parts = (module(rows, heads, _SHORTEST_CONTEXT, kv),
                 module(batch, heads * dcp, context / dcp + queries, kv),
                 module(batch, heads * dcp, _SHORTEST_CONTEXT, kv))
        return None if None in parts else parts[0] + parts[1] - parts[2]

    ms, source = timed_kv(block, kv_dtype)
    return None if ms is None else Term(ms * m.num_attention_layers, source)


def _deepseek_mla(m: ModelArch) -> bool:
    """Whether ``m``'s MLA block is DeepSeek-V3's (hidden 7168, q / kv latents 1536 / 512, rope
    64, nope and value heads 128), whatever its head count: the shape the tables timed."""
    if m.kv_heads != 0:
        return False
    heads = m.num_heads
    shapes = {x.name: (x.n, x.k) for x in m.linears if x.name in MLA_BLOCK_LINEARS}
    return shapes == {"qkv_a_proj": (2112, 7168), "q_b_proj": (heads * 192, 1536),
                      "kv_b_proj": (heads * 256, 512), "o_proj": (7168, heads * 128)}


def prompt_attention(node: Node, layers: int, heads: int, kv_heads: int, head_dim: int,
                     batch: int, prompt: int, roofline: Term, kv_dtype: str = BF16) -> Term:
    """Causal attention of ``batch`` whole prompts of ``prompt`` tokens each on one rank, with
    a ``kv_dtype`` cache (``timed_kv``; the context tables time a prompt without a cached
    prefix; a chunk that continues a longer prompt is the roofline's)."""
    t = node.kernels
    if t is None:
        return roofline
    return _per_layer(timed_kv(
        lambda kv: t.mla_context_ms(batch, heads, prompt, kv) if kv_heads == 0
        else t.attention_context_ms(batch, heads, kv_heads, head_dim, prompt, kv), kv_dtype),
        layers, roofline)


def _per_layer(timed: tuple[float | None, str], layers: int, roofline: Term) -> Term:
    """One layer's timed (time, source) for every layer, or the roofline where none was
    timed."""
    ms, source = timed
    if ms is None:
        return roofline
    return Term(ms * layers, source, roofline.sol_ms)


def moe_dtypes(bits: float, fmt: str = "") -> tuple[str, ...]:
    """The MoE table dtypes that may time experts of ``bits`` a weight in format ``fmt``."""
    if fmt == "mxfp4":
        return _MXFP4_DTYPES
    return (next(name for limit, name in _MOE_DTYPES if bits <= limit),)


def linear_attention(node: Node, m: ModelArch, batch: int, tokens: int, heads: int,
                     phase: str) -> Term:
    """The KDA layers of one forward on a rank holding ``heads`` of their heads: ``batch``
    requests of ``tokens`` tokens each (phase ``generation``: one, ``verify``: a speculative
    window, ``context``: a prompt). Each request reads and writes its fixed state once, the
    tokens run through it in turn; the tables time the engine's kernels, the roofline prices
    the state's bytes and the recurrence's FLOPs where they do not."""
    la = m.linear_attention
    state = heads * la.head_dim * la.head_dim * FP32_BYTES  # one layer
    nbytes = la.layers * batch * 2 * state
    flops = la.layers * batch * tokens * KDA_FLOPS_PER_STATE * heads * la.head_dim ** 2
    sol = node.sol_ms(nbytes, flops)
    t = node.kernels
    if t is not None:
        for kernels in _KDA_KERNELS.get((t.engine, phase), ()):
            ms = t.kda_ms(phase, kernels, batch, tokens, heads)
            if ms is not None:
                return Term(ms * la.layers, MEASURED, sol)
    return Term(max(node.mem_ms(nbytes), node.compute_ms(flops, math.inf)), ROOFLINE, sol)


def moe_distribution(skew: float) -> tuple[str, float]:
    """The table's routing for a model's Zipf skew (routing.py), and the skew that stands for
    it. Real traffic never routes evenly: a model whose routing was never measured (skew 0) is
    timed under the 1.01 power law, the routing AIConfigurator's own estimates assume for
    DeepSeek-style MoEs; a measured skew picks the nearer of the two power laws."""
    return ("power_law_1.2", 1.2) if skew >= 1.1 else ("power_law_1.01", 1.01)


def experts(node: Node, m: ModelArch, tokens: int, tp: int, ep: int,
            roofline: Callable[[float], Term]) -> Term:
    """The routed experts of every MoE layer for ``tokens`` tokens: the table's time on the
    slowest rank where it has this model's shape and split, else ``roofline(skew)`` at the
    model's own routing skew. The speed of light of a measured time is the roofline's under the
    table's routing."""
    if node.kernels is None or not m.is_moe:
        return roofline(m.routing_skew)
    distribution, skew = moe_distribution(m.routing_skew)
    cold = _cold_experts_ms(node, m, tp, ep)
    ms = next((ms for dtype in moe_dtypes(m.expert_weight_bits, m.expert_format)
               if (ms := node.kernels.moe_ms(tokens, m.moe_hidden, m.moe_inter, m.top_k,
                                             m.num_experts, tp // ep, ep, dtype,
                                             distribution, cold)) is not None), None)
    if ms is None:
        return roofline(m.routing_skew)
    ms *= m.num_moe_layers
    # Our routing model's expert count can exceed what the measured rank streamed: the speed
    # of light is then the measured time itself (100%), never above it.
    return Term(ms, MEASURED, min(ms, roofline(skew).sol_ms))


def _cold_experts_ms(node: Node, m: ModelArch, tp: int,
                     ep: int) -> Callable[[float], float] | None:
    """Where the GPU's L2 size is known: the least time one layer's experts take to stream
    from memory on the busiest rank when ``n`` tokens route evenly (``n x top_k`` distinct
    experts, at most all, spread evenly over the EP ranks, each split over ``tp // ep``
    ranks, at the datasheet bandwidth), if they fit in the L2; 0 where they do not (a row
    cannot have run from the cache). One function per GPU, model and split, so that the
    tables' verdict on its rows is worked out once."""
    if not node.hw.l2_mib:
        return None
    return _cold_ms(node.hw, m.expert_bytes, m.top_k, m.num_experts, tp, ep)


@cache
def _cold_ms(hw: Hardware, expert_bytes: float, top_k: int, num_experts: int, tp: int,
             ep: int) -> Callable[[float], float]:
    l2_bytes = hw.l2_mib * 2**20

    def cold_ms(n: float) -> float:
        held = math.ceil(min(n * top_k, num_experts) / ep)
        nbytes = held * expert_bytes / (tp // ep)
        return nbytes / (hw.bandwidth_gbs * 1e9) * 1e3 if nbytes <= l2_bytes else 0.0

    return cold_ms


def collective(node: Node, c: Collectives, group: int, kind: str, graph: bool,
               custom_all_reduce: bool = True, scale: float = 1.0) -> Term:
    """``c.count`` collectives of ``kind`` over ``group`` ranks, each ``c.nbytes`` (times
    ``scale``: the busiest rank's share of an all-to-all); ``custom_all_reduce``: the engine's
    own all-reduce is allowed where it would use it."""
    if group <= 1:
        return Term(0.0, MEASURED)
    nbytes = c.nbytes * scale
    factor = 2.0 if kind == "all_reduce" else 1.0
    sol = c.count * node.wire_ms(factor * (group - 1) / group * nbytes)
    custom = custom_all_reduce and kind == "all_reduce" and (
        node.nvlink or group == 2 or (node.kernels is not None and node.kernels.engine == "sglang"))
    ms = _collective_table(node.kernels, kind, nbytes / BF16_BYTES, group, graph, custom)
    if ms is not None:
        return Term(c.count * ms, MEASURED, sol)
    each = (node.all_to_all_ms(nbytes, group) if kind == "all_to_all"
            else node.collective_ms(nbytes, group, kind == "all_reduce"))
    return Term(c.count * each, ROOFLINE, sol)


def _collective_table(tables: KernelTables | None, kind: str, elements: float, group: int,
                      graph: bool, custom: bool) -> float | None:
    if tables is None:
        return None
    if custom and elements <= CUSTOM_ALL_REDUCE_MAX_ELEMENTS:
        ms = tables.custom_all_reduce_ms(elements, group, graph)
        if ms is not None:
            return ms
    op = "alltoall" if kind == "all_to_all" else kind
    return tables.collective_ms(op, elements, group)
