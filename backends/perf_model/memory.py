"""Does a configuration fit in GPU memory, and how many requests can its KV pool hold?

Per GPU: the static pool (``mem_fraction_static`` of memory) holds the target's and drafter's
weights and the KV pool; the rest must hold the activation workspace, graph pools and runtime
(SGLang). vLLM's fraction holds all of them, the workspace taken out before the KV pool.
A KV pool too small for every running request does not crash an engine, it caps how many run
at once, so that is what the plan reports; only a pool that cannot hold one request, or weights
that do not fit, make a configuration infeasible.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.launch_params import LaunchParams
from backends.perf_model import constants as C
from backends.perf_model.catalog import BF16_BYTES
from backends.perf_model.catalog import DrafterArch
from backends.perf_model.catalog import ModelArch

GIB = 2**30


@dataclass(slots=True, frozen=True)
class MemoryPlan:
    weights_gib: float
    drafter_gib: float
    kv_pool_gib: float
    workspace_gib: float
    max_requests: int  # per data-parallel replica
    infeasible: str = ""  # why it does not fit; empty when it does

    @property
    def peak_gib(self) -> float:
        return self.weights_gib + self.drafter_gib + self.kv_pool_gib + self.workspace_gib


def plan_memory(m: ModelArch, d: DrafterArch | None, lp: LaunchParams, memory_gib: float,
                tokens_per_request: int, engine: str = "sglang") -> MemoryPlan:
    """``engine`` decides what the memory fraction bounds: the weights and the KV pool, or the
    workspace too (constants.WORKSPACE_IN_MEMORY_FRACTION)."""
    weights = _target_weights_gib(m, lp)
    drafter = (d.weight_bytes / lp.tp_size / GIB) if (d and lp.speculative) else 0.0
    static = lp.mem_fraction_static * memory_gib
    workspace = _workspace_gib(m, lp)
    inside = workspace if engine in C.WORKSPACE_IN_MEMORY_FRACTION else 0.0
    kv_pool = static - weights - drafter - inside
    common = dict(weights_gib=weights, drafter_gib=drafter, workspace_gib=workspace)
    if kv_pool <= 0:
        what = "weights and activations" if inside else "weights"
        return MemoryPlan(kv_pool_gib=0.0, max_requests=0, **common, infeasible=(
            f"{what} need {weights + drafter + inside:.1f} GiB per GPU, the memory fraction "
            f"allows {static:.1f} GiB"))
    if not inside and workspace > memory_gib - static:
        return MemoryPlan(kv_pool_gib=kv_pool, max_requests=0, **common, infeasible=(
            f"activations and graphs need {workspace:.1f} GiB, only "
            f"{memory_gib - static:.1f} GiB left outside mem_fraction_static"))
    per_token = _kv_bytes_per_token_gpu(m, d, lp)
    capacity_tokens = kv_pool * GIB / per_token
    per_request = tokens_per_request * per_token + _state_bytes_per_request_gpu(m, lp)
    max_requests = min(lp.max_running_requests, int(kv_pool * GIB // per_request))
    if max_requests < 1:
        return MemoryPlan(kv_pool_gib=kv_pool, max_requests=0, **common, infeasible=(
            f"KV pool of {kv_pool:.1f} GiB holds {capacity_tokens:.0f} tokens, "
            f"one request needs {tokens_per_request}"))
    return MemoryPlan(kv_pool_gib=kv_pool, max_requests=max_requests, **common)


def _target_weights_gib(m: ModelArch, lp: LaunchParams) -> float:
    tp = lp.tp_size
    routed = m.num_moe_layers * m.num_experts * m.expert_bytes
    dense = m.weight_bytes - routed
    # Attention-DP replicates the non-expert weights (attention, dense and shared MLPs,
    # embedding, LM head) on every rank of the TP group: ~22 GiB for Kimi K2.6
    # (REFERENCE_NUMBERS.md), which is why attention-DP8 does not fit on 96 GB cards.
    dense_share = dense if lp.enable_dp_attention else dense / tp
    return (dense_share + routed / tp) / GIB


def kv_capacity_tokens(m: ModelArch, d: DrafterArch | None, lp: LaunchParams,
                       kv_pool_gib: float) -> float:
    """Tokens a KV pool of ``kv_pool_gib`` per GPU holds (what engines log at start-up)."""
    return kv_pool_gib * GIB / _kv_bytes_per_token_gpu(m, d, lp)


def _kv_bytes_per_token_gpu(m: ModelArch, d: DrafterArch | None, lp: LaunchParams) -> float:
    """KV bytes one token of one request costs on each GPU of the replica that stores it."""
    tp, layers = lp.tp_size, m.num_attention_layers
    if lp.enable_dp_attention:  # a request's KV lives on one rank, so capacity adds up
        target = layers * m.kv_bytes_per_token_layer / tp
    elif m.kv_heads:
        target = layers * m.kv_bytes_per_token_layer / min(tp, m.kv_heads)
    else:  # MLA latent replicated on every TP rank
        target = layers * m.kv_bytes_per_token_layer
    if not lp.enable_dp_attention:  # decode context parallelism: each rank keeps 1/dcp
        target /= lp.decode_context_parallel_size
    draft = 0.0
    if d and lp.speculative:  # the draft pool keeps one slot per target token
        draft = d.num_layers * d.kv_bytes_per_token_layer / min(tp, d.kv_heads)
    # Both engines store the draft pool in the target's KV dtype unless told otherwise.
    return (target + draft) * C.KV_CACHE_SCALE[lp.kv_cache_dtype]


def _state_bytes_per_request_gpu(m: ModelArch, lp: LaunchParams) -> float:
    """A request's linear-attention state on each GPU that holds it (one copy: engines that
    keep extra state slots for prefix caching need more). Attention-DP keeps it on one rank."""
    la = m.linear_attention
    if la is None:
        return 0.0
    return la.state_bytes(1) / lp.tp_size if lp.enable_dp_attention else la.state_bytes(lp.tp_size)


def _workspace_gib(m: ModelArch, lp: LaunchParams) -> float:
    """Runtime reserve plus activations of the largest forward (prefill chunk or graph)."""
    graph_tokens = max(lp.capture_batch_sizes, default=0) * lp.verify_tokens
    tokens = max(C.CHUNKED_PREFILL_TOKENS, graph_tokens)
    # Logits in fp32 over the vocab shard, plus ~32 hidden-sized activation buffers a token
    # (residual, norms, q/k/v, attention output, gate/up at 3x hidden and their product, in
    # bf16 with the allocator's double buffering: an upper estimate, not a profile).
    per_token = m.vocab * 4 / lp.tp_size + 32 * m.hidden * BF16_BYTES
    # Captured graphs' private memory pool: engines log 0.3-1 GiB for a full ladder.
    graphs = 0.5 if lp.capture_batch_sizes else 0.0
    return C.RUNTIME_RESERVE_GIB + graphs + tokens * per_token / GIB
