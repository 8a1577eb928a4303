"""Time of one decode step on one GPU of a data-parallel replica, by component.

A step is one target forward over ``batch x tokens_per_request`` tokens (1 for plain decoding,
the block for DFlash, budget + 1 for DDTree), preceded by one drafter forward when speculating.
Each component is a ``terms.Term``: looked up in the GPU's measured kernel tables where they
cover it (dense GEMMs at the step's rows, the MoE kernel at the step's tokens, attention,
every collective at its size), a roofline where they do not, and a fitted constant for what no
table holds (small kernels, expert-parallel overhead, host time). Every term stays visible in
the breakdown, with its source and its share of the speed of light.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from backends.launch_params import LaunchParams
from backends.perf_model import constants as C
from backends.perf_model.catalog import BF16_BYTES, DrafterArch
from backends.perf_model.catalog import ModelArch
from backends.perf_model.node import Node
from backends.perf_model.routing import busiest_rank_experts
from backends.perf_model.routing import ep_load_imbalance
from backends.perf_model.shapes import SHARED_EXPERT
from backends.perf_model.terms import FITTED, MLA_BLOCK_LINEARS, ROOFLINE, Term
from backends.perf_model.streams import shared_expert_beside_routed
from backends.perf_model.terms import collective, concurrent, decode_attention, experts
from backends.perf_model.terms import mla_block
from backends.perf_model.terms import fitted, gemms, linear_attention, prompt_attention, total
from backends.perf_model.traffic import Collectives
from backends.perf_model.traffic import context_parallel_collectives, target_collectives

__all__ = ["Forward", "Node", "draft_forward", "graphed", "target_forward"]


@dataclass(slots=True, frozen=True)
class Forward:
    """Per-GPU time of one forward pass, by component (ms)."""

    gemm: Term  # the dense (non-expert) GEMMs, LM head included
    moe: Term  # the routed experts (and the shared expert where it runs beside them)
    attention: Term
    comm: Term
    small_kernels: Term  # the layers' non-GEMM kernels (Efficiency.kernel_fixed_us each)
    ep_dispatch: Term  # expert parallelism outside the MoE kernel (Efficiency.ep_dispatch_us)
    host: float
    linear_attention: Term = Term(0.0, FITTED)  # a hybrid model's KDA layers

    @property
    def terms(self) -> dict[str, Term]:
        return {"gemm": self.gemm, "moe": self.moe, "attention": self.attention,
                "linear_attention": self.linear_attention, "comm": self.comm,
                "small_kernels": self.small_kernels, "ep_dispatch": self.ep_dispatch}

    @property
    def device(self) -> float:
        return sum(t.ms for t in self.terms.values())


def graphed(lp: LaunchParams, batch: int) -> int | None:
    """The captured batch size a step of ``batch`` replays (padded), or None if it runs eagerly."""
    return next((b for b in lp.capture_batch_sizes if b >= batch), None)


def target_forward(node: Node, m: ModelArch, lp: LaunchParams, batch: int, tokens_per_req: int,
                   context: float, use_graph: bool, padded_batch: int | None = None,
                   prefill: bool = False) -> Forward:
    """``padded_batch``: rows a captured graph computes; padding costs compute, wire bytes and
    expert reads, but reads no KV (it has no context). ``prefill``: a chunk of whole prompts
    (``tokens_per_req`` each, ``context`` their mean position), timed by the prompt-attention
    tables; a chunk of a longer prompt is the roofline's."""
    tp, ep = lp.tp_size, lp.ep_size
    tokens = (padded_batch or batch) * tokens_per_req
    imbalance = _imbalance(m, lp)
    # Attention-DP replicates the non-expert weights (as memory.py counts them): each rank runs
    # them whole for its own share of the requests.
    dp_attention = lp.enable_dp_attention and tp > 1
    dense_tp, rank_rows = (1, math.ceil(tokens / tp)) if dp_attention else (tp, tokens)
    if node.kernels is None:
        gemm, moe = _weights_roofline(node, m, lp, tokens)
    else:
        # The dense GEMMs outside and inside an MLA block (which vLLM's tables time whole).
        dense = tuple(x for x in m.linears if x.name not in MLA_BLOCK_LINEARS)
        block_gemm = gemms(node, tuple(x for x in m.linears if x.name in MLA_BLOCK_LINEARS),
                           rank_rows, dense_tp)
        moe = experts(node, m, tokens, tp, ep,
                      lambda skew: _moe_roofline(node, m, lp, tokens, skew))
        if shared_expert_beside_routed(node.engine, m, lp, tokens, use_graph):
            shared = tuple(x for x in dense if x.name.startswith(SHARED_EXPERT))
            dense = tuple(x for x in dense if x not in shared)
            moe = concurrent(moe, gemms(node, shared, rank_rows, dense_tp))
        gemm = gemms(node, dense, rank_rows, dense_tp)
    rank_batch = math.ceil(batch / tp) if dp_attention else batch
    heads = m.num_heads if dp_attention else max(1, m.num_heads // tp)
    kv_heads = m.kv_heads if dp_attention or not m.kv_heads else max(1, m.kv_heads // tp)
    # Decode context parallelism: each of ``dcp`` ranks holds 1/dcp of every request's KV and
    # attends for the queries of all dcp ranks' heads over it (prompts are not split).
    dcp = 1 if prefill or dp_attention else lp.decode_context_parallel_size
    layers, kv_dtype = m.num_attention_layers, C.KV_TABLE_DTYPE[lp.kv_cache_dtype]
    attention = _attention_roofline(node, layers, m.kv_bytes_per_token_layer, m.kv_heads,
                                    m.attn_flops_per_token_ctx_layer, lp, batch, tokens, context,
                                    context_split=dcp)
    if prefill and context <= tokens_per_req:
        attention = prompt_attention(node, layers, heads, kv_heads, m.head_dim,
                                     rank_batch, tokens_per_req, attention, kv_dtype)
    elif not prefill:
        attention = decode_attention(node, layers, heads * dcp, kv_heads, m.head_dim,
                                     rank_batch, tokens_per_req, context / dcp, attention,
                                     kv_dtype)
    block = (None if dp_attention or (prefill and context > tokens_per_req) else
             mla_block(node, m, heads, rank_batch, tokens, tokens_per_req, context, prefill,
                       dcp, kv_dtype))
    if block is not None:  # vLLM's MLA module tables time the block's GEMMs with its attention
        attention = Term(block.ms, block.source, attention.sol_ms + block_gemm.sol_ms)
    elif node.kernels is not None:
        gemm = total([gemm, block_gemm])
    linear = _linear_attention(node, m, lp, rank_batch, tokens_per_req, dp_attention, prefill)
    collectives = target_collectives(m, lp, tokens)
    if dcp > 1:
        collectives |= context_parallel_collectives(m, heads, dcp, tokens)
    comm = _comm(node, collectives, lp, use_graph, imbalance)
    dispatch = fitted(m.num_moe_layers * node.eff.ep_dispatch_us / 1e3 if ep > 1 else 0.0)
    launches = m.eager_launches + _collective_launches(collectives) + C.KERNELS_PER_FORWARD
    host = node.host_ms(C.GRAPH_REPLAY_LAUNCHES if use_graph else launches)
    return Forward(gemm, moe, attention, comm, fitted(node.kernels_ms(m.small_kernels)),
                   dispatch, host, linear)


def draft_forward(node: Node, m: ModelArch, d: DrafterArch, lp: LaunchParams, batch: int,
                  committed_per_req: float, context: float, use_graph: bool,
                  padded_batch: int | None = None) -> Forward:
    """The drafter's work in one round. DFlash: one pass over ``block_size`` positions a
    request. A chain drafter (EAGLE-3, MTP): ``block_size - 1`` passes of one position a
    request, each waiting for the token the last one drew. Either way the first pass fuses the
    tokens the last step committed into the drafter's context (their tapped target states);
    the LM head is the target's."""
    block = lp.speculative_dflash_block_size
    committed = batch * committed_per_req
    if not d.chain:
        return _draft_pass(node, m, d, lp, batch, block, committed, context, use_graph,
                           padded_batch)
    first = _draft_pass(node, m, d, lp, batch, 1, committed, context, use_graph, padded_batch)
    later = _draft_pass(node, m, d, lp, batch, 1, 0, context, use_graph, padded_batch)
    return _in_sequence([first] + [later] * (block - 2))


def _draft_pass(node: Node, m: ModelArch, d: DrafterArch, lp: LaunchParams, batch: int,
                positions: int, committed: float, context: float, use_graph: bool,
                padded_batch: int | None) -> Forward:
    """One drafter forward over ``positions`` tokens a request, after fusing the tapped target
    states of ``committed`` tokens (0: the pass reads the drafter's own last state)."""
    tp = lp.tp_size
    rows = (padded_batch or batch) * positions
    lm_head = tuple(x for x in m.linears if x.name == "lm_head")
    linears = d.pass_linears(fuses=bool(committed))
    if node.kernels is None:
        lm_params = m.vocab * m.hidden
        fc_params = d.fc_params if committed else 0
        nbytes = (d.num_layers * d.params_per_layer + fc_params + lm_params) * BF16_BYTES / tp
        flops = 2.0 * (rows * (d.num_layers * d.params_per_layer + lm_params)
                       + committed * fc_params) / tp
        fixed = node.eff.matmul_fixed_us * (d.num_layers * (C.MATMULS_PER_ATTENTION + 2) + 2)
        gemm = Term(node.linear_ms(nbytes, flops, rows) + fixed / 1e3, ROOFLINE,
                    node.sol_ms(nbytes, flops))
    else:
        gemm = gemms(node, linears + lm_head, rows, tp,
                     rows_of={"fc": max(1, math.ceil(committed))})
    kv_heads = max(1, d.kv_heads // tp)
    attention = decode_attention(
        node, d.num_layers, max(1, d.num_heads // tp), kv_heads, d.head_dim, batch, positions,
        context, _attention_roofline(node, d.num_layers, d.kv_bytes_per_token_layer,
                                     d.kv_heads, d.attn_flops_per_token_ctx_layer, lp, batch,
                                     rows, context),
        C.KV_TABLE_DTYPE[lp.kv_cache_dtype])
    # Tensor parallelism only: an all-reduce after attention and after the MLP, the logit gather.
    collectives = {} if tp <= 1 else {
        "hidden": Collectives(2 * d.num_layers, rows * d.hidden * BF16_BYTES, "all_reduce"),
        "logits": Collectives(1, rows * m.vocab * BF16_BYTES, "all_gather")}
    comm = _comm(node, collectives, lp, use_graph, 1.0)
    launches = (d.eager_launches(fuses=bool(committed)) + _collective_launches(collectives)
                + C.KERNELS_PER_FORWARD)
    if lp.is_ddtree:
        launches += C.TREE_BUILD_KERNELS
    host = node.host_ms(C.GRAPH_REPLAY_LAUNCHES if use_graph else launches)
    none = fitted(0.0)
    return Forward(gemm, none, attention, comm, fitted(node.kernels_ms(d.small_kernels)), none,
                   host)


def _in_sequence(passes: list[Forward]) -> Forward:
    """Forwards run one after another: every component and the host time add."""
    def add(name: str) -> Term:
        return total(getattr(f, name) for f in passes)

    return Forward(add("gemm"), add("moe"), add("attention"), add("comm"), add("small_kernels"),
                   add("ep_dispatch"), sum(f.host for f in passes), add("linear_attention"))


def _collective_launches(collectives: dict[str, Collectives]) -> int:
    return sum(c.count for c in collectives.values())


def _linear_attention(node: Node, m: ModelArch, lp: LaunchParams, batch: int, tokens: int,
                      dp_attention: bool, prefill: bool) -> Term:
    """The KDA layers: their heads split over the TP ranks (whole under attention-DP)."""
    la = m.linear_attention
    if la is None:
        return fitted(0.0)
    heads = la.heads if dp_attention else max(1, la.heads // lp.tp_size)
    phase = "context" if prefill else ("generation" if tokens == 1 else "verify")
    return linear_attention(node, m, batch, tokens, heads, phase)


def _imbalance(m: ModelArch, lp: LaunchParams) -> float:
    """The busiest EP rank's token load over the mean rank's (routing.ep_load_imbalance)."""
    if not m.is_moe:
        return 1.0
    return ep_load_imbalance(m.num_experts, m.top_k, lp.ep_size, m.routing_skew)


def _expert_work(m: ModelArch, lp: LaunchParams, tokens: int,
                 skew: float) -> tuple[float, float, float]:
    """(experts the busiest EP rank holds among those the step touches under routing ``skew``,
    the bytes it streams for them once, its share of the routed GEMM FLOPs scaled by the EP
    load imbalance)."""
    if not m.is_moe:
        return 0.0, 0.0, 0.0
    touched = busiest_rank_experts(m.num_experts, m.top_k, tokens, lp.ep_size, skew)
    imbalance = ep_load_imbalance(m.num_experts, m.top_k, lp.ep_size, skew)
    nbytes = m.num_moe_layers * touched * m.expert_bytes / (lp.tp_size // lp.ep_size)
    flops = 2.0 * tokens * m.num_moe_layers * m.top_k * m.expert_params * imbalance / lp.tp_size
    return touched, nbytes, flops


def _weights_roofline(node: Node, m: ModelArch, lp: LaunchParams,
                      tokens: int) -> tuple[Term, Term]:
    """Without kernel tables: one roofline over every weight the step streams (the dense
    weights and the busiest rank's experts) and its GEMM work, split between the dense GEMMs
    and the experts by their bytes; each weight matrix adds its fixed cost."""
    touched, expert_bytes, expert_flops = _expert_work(m, lp, tokens, m.routing_skew)
    # Attention-DP replicates the non-expert weights, so each rank streams all of them.
    dense_bytes = m.dense_bytes / (1 if lp.enable_dp_attention else lp.tp_size)
    dense_flops = 2.0 * tokens * m.dense_params / lp.tp_size
    weights = node.linear_ms(dense_bytes + expert_bytes, dense_flops + expert_flops, tokens)
    share = dense_bytes / (dense_bytes + expert_bytes)
    fixed = node.eff.matmul_fixed_us / 1e3
    dense_matrices = (m.num_layers * C.MATMULS_PER_ATTENTION + 2 * m.num_dense_layers
                      + m.num_moe_layers * (2 if m.shared_expert_params else 0) + 1)
    gemm = Term(weights * share + fixed * dense_matrices, ROOFLINE,
                node.sol_ms(dense_bytes, dense_flops))
    moe = Term(weights * (1 - share) + fixed * m.num_moe_layers * 2 * touched, ROOFLINE,
               node.sol_ms(expert_bytes, expert_flops))
    return gemm, moe


def _moe_roofline(node: Node, m: ModelArch, lp: LaunchParams, tokens: int, skew: float) -> Term:
    """The busiest rank's experts on their own (``_expert_work``), as a roofline."""
    touched, nbytes, flops = _expert_work(m, lp, tokens, skew)
    fixed = node.eff.matmul_fixed_us * m.num_moe_layers * 2 * touched / 1e3
    return Term(node.linear_ms(nbytes, flops, tokens) + fixed, ROOFLINE,
                node.sol_ms(nbytes, flops))


def _attention_roofline(node: Node, layers: int, kv_bytes_layer: int, kv_heads: int,
                        flops_per_ctx_layer: int, lp: LaunchParams, batch: int, tokens: int,
                        context: float, context_split: int = 1) -> Term:
    """Reads each request's prefix K/V once for all its tokens (verify is prefill-like), in the
    launch's KV dtype; ``context_split`` ranks share each prefix (decode context parallelism),
    the same FLOPs."""
    tp = lp.tp_size
    if lp.enable_dp_attention:  # each rank attends for its own requests with all heads
        share = 1.0 / tp
    else:  # MLA's latent (kv_heads == 0) is replicated on every TP rank; GQA splits by head
        share = (1.0 / min(tp, kv_heads) if kv_heads else 1.0) / context_split
    scale = C.KV_CACHE_SCALE[lp.kv_cache_dtype]  # an 8-bit cache: half the bytes
    kv_bytes = batch * context * layers * kv_bytes_layer * share * scale
    flops = tokens * context * layers * flops_per_ctx_layer / tp
    # Attention tiles over heads and context, not over the step's rows: no small-shape penalty.
    ms = max(node.mem_ms(kv_bytes), node.compute_ms(flops, math.inf))
    return Term(ms, ROOFLINE, node.sol_ms(kv_bytes, flops))


def _comm(node: Node, collectives: dict[str, Collectives], lp: LaunchParams, graph: bool,
          imbalance: float) -> Term:
    """``imbalance``: the busiest EP rank receives that many times the mean dispatch."""
    parts = []
    for key, c in collectives.items():
        kind, group = c.kind or key, c.group or lp.tp_size
        scale = imbalance if kind == "all_to_all" else 1.0
        parts.append(collective(node, c, group, kind, graph,
                                not lp.disable_custom_all_reduce, scale))
    return total(parts)
