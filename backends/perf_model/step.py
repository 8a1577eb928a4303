"""Time of one decode step on one GPU of a data-parallel replica, by component.

A step is one target forward over ``batch x tokens_per_request`` tokens (1 for plain decoding,
the block for DFlash, budget + 1 for DDTree), preceded by one drafter forward when speculating.
Each component is a roofline (bytes / achieved bandwidth vs FLOPs / achieved throughput) or a
latency term, and stays visible in the returned breakdown so a user can see what dominates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from backends.launch_params import LaunchParams
from backends.perf_model import constants as C
from backends.perf_model.catalog import BF16_BYTES
from backends.perf_model.catalog import DrafterArch
from backends.perf_model.catalog import Hardware
from backends.perf_model.catalog import ModelArch
from backends.perf_model.constants import Efficiency
from backends.perf_model.routing import busiest_rank_experts
from backends.perf_model.routing import ep_load_imbalance
from backends.perf_model.traffic import target_collectives


@dataclass(slots=True, frozen=True)
class Node:
    """One GPU type with the efficiency constants that turn datasheets into achieved numbers."""

    hw: Hardware
    eff: Efficiency

    def mem_ms(self, nbytes: float) -> float:
        return nbytes / (self.hw.bandwidth_gbs * 1e9 * self.eff.bandwidth_efficiency) * 1e3

    def compute_ms(self, flops: float, rows: float) -> float:
        """Tensor work of GEMMs ``rows`` tall: small shapes reach less of the peak."""
        shape = 1.0 if math.isinf(rows) else rows / (rows + C.GEMM_HALF_ROWS)
        return flops / (self.hw.bf16_tflops * 1e12 * self.eff.compute_efficiency * shape) * 1e3

    def linear_ms(self, nbytes: float, flops: float, rows: float) -> float:
        """Weight-streaming GEMMs: a roofline, bound by the weight stream or by tensor work."""
        return max(self.mem_ms(nbytes), self.compute_ms(flops, rows))

    def collective_ms(self, nbytes: float, group: int, all_reduce: bool) -> float:
        """Ring collective over ``group`` GPUs: all-reduce moves twice an all-gather's bytes."""
        if group <= 1:
            return 0.0
        factor = 2.0 if all_reduce else 1.0
        wire = factor * (group - 1) / group * nbytes / (self.hw.link_gbs * 1e9) * 1e3
        return self.eff.collective_latency_us / 1e3 + wire

    def all_to_all_ms(self, nbytes: float, group: int) -> float:
        """Expert dispatch (or combine) of ``nbytes`` a rank holds: (group-1)/group of it leaves
        the rank, the same share arrives, over each GPU's own link."""
        if group <= 1:
            return 0.0
        wire = (group - 1) / group * nbytes / (self.hw.link_gbs * 1e9) * 1e3
        return self.eff.collective_latency_us / 1e3 + wire

    def kernels_ms(self, kernels: int) -> float:
        """GPU time of ``kernels`` small kernels beyond their bytes and FLOPs (fixed each)."""
        return kernels * self.eff.kernel_fixed_us / 1e3

    def host_ms(self, launches: float) -> float:
        return launches * self.eff.launch_overhead_us / 1e3


@dataclass(slots=True, frozen=True)
class Forward:
    """Per-GPU time of one forward pass, by component (ms)."""

    weights: float
    kv: float
    matmul_fixed: float
    comm: float
    host: float
    small_kernels: float  # the layers' non-GEMM kernels (Efficiency.kernel_fixed_us each)

    @property
    def device(self) -> float:
        return self.weights + self.kv + self.matmul_fixed + self.comm + self.small_kernels


def graphed(lp: LaunchParams, batch: int) -> int | None:
    """The captured batch size a step of ``batch`` replays (padded), or None if it runs eagerly."""
    return next((b for b in lp.capture_batch_sizes if b >= batch), None)


def target_forward(node: Node, m: ModelArch, lp: LaunchParams, batch: int, tokens_per_req: int,
                   context: float, use_graph: bool, padded_batch: int | None = None) -> Forward:
    """``padded_batch``: rows a captured graph computes; padding costs compute, wire bytes and
    expert reads, but reads no KV (it has no context)."""
    tp = lp.tp_size
    tokens = (padded_batch or batch) * tokens_per_req
    experts = (busiest_rank_experts(m.num_experts, m.top_k, tokens, lp.ep_size, m.routing_skew)
               if m.is_moe else 0)
    imbalance = _imbalance(m, lp)
    moe_tp = tp // lp.ep_size
    # Attention-DP replicates the non-expert weights (as memory.py counts them), so each
    # rank streams all of them for its own requests.
    dense_bytes = m.dense_bytes / (1 if lp.enable_dp_attention else tp)
    expert_bytes = m.num_moe_layers * experts * m.expert_bytes / moe_tp
    linear_flops = 2.0 * tokens * _active_params(m, imbalance) / tp
    weights = node.linear_ms(dense_bytes + expert_bytes, linear_flops, tokens)
    kv = _attention_ms(node, m.num_layers, m.kv_bytes_per_token_layer, m.kv_heads,
                       m.attn_flops_per_token_ctx_layer, lp, batch, tokens, context)
    matrices = (m.num_layers * C.MATMULS_PER_ATTENTION + 2 * m.num_dense_layers
                + m.num_moe_layers * (2 * experts + (2 if m.shared_expert_params else 0)) + 1)
    comm = _target_comm_ms(node, m, lp, tokens, imbalance)
    launches = m.num_layers * C.KERNELS_PER_LAYER + C.KERNELS_PER_FORWARD
    host = node.host_ms(C.GRAPH_REPLAY_LAUNCHES if use_graph else launches)
    return Forward(weights, kv, node.eff.matmul_fixed_us * matrices / 1e3, comm, host,
                   node.kernels_ms(m.small_kernels))


def draft_forward(node: Node, m: ModelArch, d: DrafterArch, lp: LaunchParams, batch: int,
                  committed_per_req: float, context: float, use_graph: bool,
                  padded_batch: int | None = None) -> Forward:
    """One DFlash drafter pass: ``block_size`` positions a request, plus fusing the tokens the
    last step committed into the drafter's context K/V. Shares the target's LM head."""
    tp = lp.tp_size
    tokens = (padded_batch or batch) * lp.speculative_dflash_block_size
    lm_head = m.vocab * m.hidden
    weight_bytes = (d.weight_bytes + lm_head * BF16_BYTES) / tp
    flops = 2.0 * (tokens * (d.num_layers * d.params_per_layer + lm_head)
                   + batch * committed_per_req * d.fc_params) / tp
    weights = node.linear_ms(weight_bytes, flops, tokens)
    kv = _attention_ms(node, d.num_layers, d.kv_bytes_per_token_layer, d.kv_heads,
                       d.attn_flops_per_token_ctx_layer, lp, batch, tokens, context)
    matrices = d.num_layers * (C.MATMULS_PER_ATTENTION + 2) + 2
    comm = (2 * d.num_layers * node.collective_ms(tokens * d.hidden * BF16_BYTES, tp, True)
            + node.collective_ms(tokens * m.vocab * BF16_BYTES, tp, False))
    launches = d.num_layers * C.KERNELS_PER_LAYER + C.KERNELS_PER_FORWARD
    if lp.is_ddtree:
        launches += C.TREE_BUILD_KERNELS
    host = node.host_ms(C.GRAPH_REPLAY_LAUNCHES if use_graph else launches)
    return Forward(weights, kv, node.eff.matmul_fixed_us * matrices / 1e3, comm, host,
                   node.kernels_ms(d.small_kernels))


def _imbalance(m: ModelArch, lp: LaunchParams) -> float:
    """The busiest EP rank's token load over the mean rank's (routing.ep_load_imbalance)."""
    if not m.is_moe:
        return 1.0
    return ep_load_imbalance(m.num_experts, m.top_k, lp.ep_size, m.routing_skew)


def _active_params(m: ModelArch, imbalance: float) -> float:
    """Parameters a token's GEMMs use on the busiest rank (its routed share scaled by the EP
    load imbalance)."""
    routed = m.num_moe_layers * m.top_k * m.expert_params * imbalance
    return m.dense_params + routed


def _attention_ms(node: Node, layers: int, kv_bytes_layer: int, kv_heads: int,
                  flops_per_ctx_layer: int, lp: LaunchParams, batch: int, tokens: int,
                  context: float) -> float:
    """Reads each request's prefix K/V once for all its tokens (verify is prefill-like)."""
    tp = lp.tp_size
    if lp.enable_dp_attention:  # each rank attends for its own requests with all heads
        share = 1.0 / tp
    else:  # MLA's latent (kv_heads == 0) is replicated on every TP rank; GQA splits by head
        share = 1.0 / min(tp, kv_heads) if kv_heads else 1.0
    kv_bytes = batch * context * layers * kv_bytes_layer * share
    flops = tokens * context * layers * flops_per_ctx_layer / tp
    # Attention tiles over heads and context, not over the step's rows: no small-shape penalty.
    return max(node.mem_ms(kv_bytes), node.compute_ms(flops, math.inf))


def _target_comm_ms(node: Node, m: ModelArch, lp: LaunchParams, tokens: int,
                    imbalance: float) -> float:
    """``imbalance``: the busiest EP rank receives that many times the mean dispatch."""
    total = 0.0
    for key, c in target_collectives(m, lp, tokens).items():
        kind, group = c.kind or key, c.group or lp.tp_size
        each = (node.all_to_all_ms(c.nbytes * imbalance, group) if kind == "all_to_all"
                else node.collective_ms(c.nbytes, group, kind == "all_reduce"))
        total += c.count * each
    return total
