"""SGLang launch flags, 0.5.6 to 0.5.23 (DFLASH from 0.5.11; the older releases serve plain
launches, as the published benchmarks of them ran).

Spellings were read from each released wheel (notes/serving_engines.md §1.2). Logical keys follow
the LaunchParams / SGLang 0.5.13 names (``cuda_graph_max_bs``), so a tuner.yaml override reads
like the parameter it renames. Keys:

  model_path, trust_remote_code, tp_size, dp_size, ep_size, enable_dp_attention (<= 0.5.21),
  attn_dp_size, enable_dp_lm_head (>= 0.5.22), speculative_algorithm,
  speculative_draft_model_path, speculative_num_draft_tokens, speculative_ddtree_budget,
  disable_custom_all_reduce, mem_fraction_static, kv_cache_dtype, max_running_requests,
  cuda_graph_max_bs, cuda_graph_bs, disable_cuda_graph (<= 0.5.13),
  disable_piecewise_cuda_graph (0.5.10-0.5.13), cuda_graph_backend_decode,
  cuda_graph_backend_prefill (>= 0.5.14), context_length, host, port.

DDTree is not in any release; it is rendered with the spelling of the open PR #29907 branch.
NCCL_PROTO and NCCL_P2P_LEVEL go in the environment (``render_env``).
"""

from __future__ import annotations

from backends.flags._dialect import Argv
from backends.flags._dialect import DFLASH_SPECULATION
from backends.flags._dialect import EngineDialect
from backends.flags._dialect import FlagTable
from backends.flags._dialect import LaunchTarget
from backends.flags._dialect import OVERLAPPED_DFLASH_ROUNDS
from backends.flags._dialect import PrefillModel
from backends.flags._dialect import UnsupportedParams
from backends.flags._dialect import fraction
from backends.flags._dialect import kv_cache_dtype
from backends.flags._dialect import nccl_env
from backends.flags._dialect import refuse_knobs
from backends.flags._dialect import require_drafter
from backends.flags._versions import VersionRange
from backends.flags.sglang_prefill_graphs import graphed_prefill_tokens as _release_rules
from backends.launch_params import LaunchParams

_COMMON = {
    "model_path": "--model-path",
    "trust_remote_code": "--trust-remote-code",
    "tp_size": "--tp-size",
    "dp_size": "--dp-size",
    "ep_size": "--ep-size",  # --enable-ep-moe never existed in 0.5.x
    "speculative_algorithm": "--speculative-algorithm",
    "speculative_draft_model_path": "--speculative-draft-model-path",
    "speculative_num_draft_tokens": "--speculative-num-draft-tokens",
    "speculative_ddtree_budget": "--speculative-ddtree-budget",  # PR #29907 branch only
    # A server_args switch of long standing ("fall back to NCCL"); the custom kernel needs
    # peer-to-peer access between the GPUs to be fast.
    "disable_custom_all_reduce": "--disable-custom-all-reduce",
    "mem_fraction_static": "--mem-fraction-static",
    "kv_cache_dtype": "--kv-cache-dtype",
    "max_running_requests": "--max-running-requests",
    "context_length": "--context-length",
    "host": "--host",
    "port": "--port",
}
_GRAPHS_UNTIL_0_5_9 = {
    "cuda_graph_max_bs": "--cuda-graph-max-bs",
    "cuda_graph_bs": "--cuda-graph-bs",
    "disable_cuda_graph": "--disable-cuda-graph",
}
# 0.5.10 made piecewise prefill graphs the default; --disable-cuda-graph leaves them on.
_GRAPHS_0_5_10_TO_0_5_13 = {
    **_GRAPHS_UNTIL_0_5_9,
    "disable_piecewise_cuda_graph": "--disable-piecewise-cuda-graph",
}
# 0.5.14-0.5.19 still accept the old names as aliases, 0.5.20 removed them, and 0.5.23 rejects
# "--cuda-graph-max-bs" as an ambiguous prefix; the per-phase names work across the whole range.
_GRAPHS_FROM_0_5_14 = {
    "cuda_graph_max_bs": "--cuda-graph-max-bs-decode",
    "cuda_graph_bs": "--cuda-graph-bs-decode",
    "cuda_graph_backend_decode": "--cuda-graph-backend-decode",
    "cuda_graph_backend_prefill": "--cuda-graph-backend-prefill",
}
# Before 0.5.22 attention DP is a switch and its size rides on --dp-size.
_ATTN_DP_UNTIL_0_5_21 = {
    "enable_dp_attention": "--enable-dp-attention",
    "attn_dp_size": "--dp-size",
}
_ATTN_DP_FROM_0_5_22 = {
    "attn_dp_size": "--attn-dp-size",
    "enable_dp_lm_head": "--enable-dp-lm-head",  # the LM head split over the attention-DP group
}

# Knobs this dialect does not render for SGLang. SGLang 0.5.23 does have decode context
# parallelism (--dcp-size, alias --decode-context-parallel-size; its parser accepts it,
# tests/backends_tests/engine_parsers), but no study has measured it there yet.
_NOT_SGLANG = {
    "decode_context_parallel_size": "this dialect does not render SGLang's --dcp-size yet "
                                    "(the space asks it of vLLM only)",
    "cudagraph_mode": "it is vLLM's compilation setting; SGLang's graphs are cuda_graph and "
                      "cuda_graph_bs",
}

# 0.5.11-0.5.13 run DFLASH on the spec-v1 worker, which forces the overlap scheduler off: each
# round's scheduling waits for the GPU. 0.5.14 brought the spec-v2 worker (PR #23000), on by
# default, which prepares the next round while the GPU runs this one. The DDTree branch (PR
# #29907) forces the overlap off again.
_DFLASH = frozenset({DFLASH_SPECULATION})
_OVERLAPPED = frozenset({DFLASH_SPECULATION, OVERLAPPED_DFLASH_ROUNDS})

TABLES = (
    FlagTable(VersionRange("0.5.6", "0.5.9"),
              {**_COMMON, **_GRAPHS_UNTIL_0_5_9, **_ATTN_DP_UNTIL_0_5_21}),
    FlagTable(VersionRange("0.5.10", "0.5.10"),
              {**_COMMON, **_GRAPHS_0_5_10_TO_0_5_13, **_ATTN_DP_UNTIL_0_5_21}),
    FlagTable(VersionRange("0.5.11", "0.5.13"),
              {**_COMMON, **_GRAPHS_0_5_10_TO_0_5_13, **_ATTN_DP_UNTIL_0_5_21}, _DFLASH),
    FlagTable(VersionRange("0.5.14", "0.5.21"),
              {**_COMMON, **_GRAPHS_FROM_0_5_14, **_ATTN_DP_UNTIL_0_5_21}, _OVERLAPPED),
    FlagTable(VersionRange("0.5.22", "0.5.22"),
              {**_COMMON, **_GRAPHS_FROM_0_5_14, **_ATTN_DP_FROM_0_5_22}, _OVERLAPPED),
    FlagTable(VersionRange("0.5.23", "0.5.23"),
              {**_COMMON, **_GRAPHS_FROM_0_5_14, **_ATTN_DP_FROM_0_5_22}, _OVERLAPPED),
)


def render(params: LaunchParams, target: LaunchTarget, out: Argv) -> None:
    """Write ``python -m sglang.launch_server ...`` for ``params`` into ``out``."""
    refuse_knobs(params, out.label, _NOT_SGLANG)
    out.raw(*target.head("python", "-m", "sglang.launch_server"))
    out.add("model_path", target.model_path)
    if target.trust_remote_code:
        out.add("trust_remote_code")
    _parallelism(params, out)
    _speculation(params, target, out)
    if params.disable_custom_all_reduce:
        out.add("disable_custom_all_reduce")
    out.add("mem_fraction_static", fraction(params.mem_fraction_static))
    kv_cache_dtype(params, out)
    out.add("max_running_requests", params.max_running_requests)
    _cuda_graphs(params, out)
    if target.context_length is not None:
        out.add("context_length", target.context_length)
    out.add("host", target.host)
    out.add("port", target.port)


def render_env(params: LaunchParams, table: FlagTable) -> dict[str, str]:
    """Environment the launch needs for knobs that have no CLI flag."""
    env = nccl_env(params)
    if params.is_ddtree:
        # The branch caps the per-depth candidate count (tree width) only through this variable.
        env["SGLANG_DDTREE_MAX_TOPK"] = str(params.tree_width)
    return env


def _parallelism(params: LaunchParams, out: Argv) -> None:
    out.add("tp_size", params.tp_size)
    if params.dp_size > 1:
        out.add("dp_size", params.dp_size)
    if params.ep_size > 1:
        out.add("ep_size", params.ep_size)
    if params.enable_dp_attention:
        _attention_dp(params, out)


def _attention_dp(params: LaunchParams, out: Argv) -> None:
    # Attention DP spans the whole TP group: one attention replica per GPU.
    if params.speculative:
        # SGLang's docs (PR #23553): DFLASH does not support DP attention. 0.5.11-0.5.22 reject
        # it on CUDA; 0.5.23 parses it with --enable-dp-lm-head but runs the draft without CUDA
        # graphs. The DDTree branch is built on DFLASH and rejects it too.
        raise UnsupportedParams(
            f"{out.label}: speculative_algorithm={params.speculative_algorithm} does not run "
            "with enable_dp_attention (SGLang docs, PR #23553: DFLASH does not support DP "
            "attention)"
        )
    if out.has("enable_dp_attention"):
        if params.dp_size > 1:
            raise UnsupportedParams(
                f"{out.label} sizes attention DP with --dp-size; dp_size={params.dp_size} "
                "replicas cannot be combined with enable_dp_attention (needs 0.5.22+)"
            )
        out.add("enable_dp_attention")
    out.add("attn_dp_size", params.tp_size)
    if out.has("enable_dp_lm_head"):
        out.add("enable_dp_lm_head")


def _speculation(params: LaunchParams, target: LaunchTarget, out: Argv) -> None:
    if not params.speculative:
        return
    if DFLASH_SPECULATION not in out.features:
        raise UnsupportedParams(f"{out.label} has no DFLASH speculative decoding (SGLang ships "
                                "it from 0.5.11)")
    drafter = require_drafter(params, target, out.label)
    out.add("speculative_algorithm", params.speculative_algorithm.upper())
    out.add("speculative_draft_model_path", drafter)
    # SGLang counts the whole block, anchor included (vLLM counts block - 1).
    out.add("speculative_num_draft_tokens", params.speculative_dflash_block_size)
    if params.is_ddtree:
        _check_ddtree_depth(params, out.label)
        if params.speculative_ddtree_spine:
            raise UnsupportedParams(f"{out.label} DDTREE (PR #29907) has no spine option; "
                                    "speculative_ddtree_spine cannot be expressed")
        if params.round_capped:
            raise UnsupportedParams(
                f"{out.label} DDTREE (PR #29907) runs one budget at every load; "
                f"speculative_ddtree_round_tokens={params.speculative_ddtree_round_tokens} "
                "cannot be expressed")
        out.add("speculative_ddtree_budget", params.speculative_ddtree_budget)


def _check_ddtree_depth(params: LaunchParams, label: str) -> None:
    # The branch grows trees to the full draft length (block - 1) and has no depth knob, so only
    # a max_depth that does not cut below that is what will actually run.
    draft_len = params.speculative_dflash_block_size - 1
    if params.tree_depth < draft_len:
        raise UnsupportedParams(
            f"{label} DDTREE (PR #29907) has no tree-depth flag; trees reach block_size - 1 = "
            f"{draft_len}, so speculative_ddtree_max_depth="
            f"{params.speculative_ddtree_max_depth} cannot be expressed"
        )


def _cuda_graphs(params: LaunchParams, out: Argv) -> None:
    sizes = params.capture_batch_sizes
    if sizes:
        out.add("cuda_graph_max_bs", max(sizes))
        out.add("cuda_graph_bs", *sizes)
        if prefill_graphs_off(params, out.has("cuda_graph_backend_prefill")):
            out.add("cuda_graph_backend_prefill", "disabled")
    elif out.has("cuda_graph_backend_decode"):
        out.add("cuda_graph_backend_decode", "disabled")
        out.add("cuda_graph_backend_prefill", "disabled")
    else:
        out.add("disable_cuda_graph")
        if out.has("disable_piecewise_cuda_graph"):
            out.add("disable_piecewise_cuda_graph")


def prefill_graphs_off(params: LaunchParams, per_phase_flags: bool) -> bool:
    """Whether the launch of ``params`` turns the release's prefill graphs off: an eager one
    does, and from 0.5.14 (whose flags name each phase, ``per_phase_flags``) a speculative
    one: SGLang #35437, DFLASH with prefill graphs crashes at capture (breakable) or on the
    first request (full) on SM120; decode graphs are unaffected."""
    return not params.capture_batch_sizes or (params.speculative and per_phase_flags)


def graphed_prefill_tokens(params: LaunchParams, version: str, model: PrefillModel) -> float:
    """The most tokens a prefill forward holds and still runs as CUDA graphs, when SGLang
    ``version`` serves ``model`` with the launch this dialect renders for ``params`` (0: every
    prefill runs eagerly); ``sglang_prefill_graphs`` holds each release's rules."""
    per_phase = "cuda_graph_backend_prefill" in DIALECT.table(version).flags
    if prefill_graphs_off(params, per_phase):
        return 0
    return _release_rules(params, version, model)


DIALECT = EngineDialect("SGLang", "0.5.23", TABLES, render, render_env, default_port=30000,
                        ddtree_note="DDTree is in no released SGLang: this command targets "
                        "SGLang's DDTREE branch (PR #29907).",
                        graphed_prefill_tokens=graphed_prefill_tokens)
