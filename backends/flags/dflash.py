"""`dflash-tune serve` launch flags (this project's own server over dflash_core).

Tensor and expert parallelism as SGLang means them (`--tp-size N --ep-size M`: N ranks, the
experts in M groups of them); data parallelism and attention-DP are not expressible. DDTree is
native. ``FLAGS`` is the one table from the tuning names (LaunchParams fields, which are also
serve's option names) to serve's spellings: the renderer below and serve's own command line
(`backends.dflash_server.cli`) both read it.
"""

from __future__ import annotations

from backends.flags._dialect import (
    Argv,
    EngineDialect,
    FlagTable,
    LaunchTarget,
    UnsupportedParams,
    nccl_env,
    refuse_knobs,
    require_drafter,
)
from backends.flags._versions import VersionRange
from backends.launch_params import LaunchParams

FLAGS = {
    "target": "--target",
    "drafter": "--drafter",
    "speculative_algorithm": "--method",
    "speculative_dflash_block_size": "--block-size",
    "speculative_ddtree_budget": "--budget",
    "speculative_ddtree_topk": "--width",
    "speculative_ddtree_max_depth": "--depth",
    "speculative_ddtree_round_tokens": "--round-tokens",
    "speculative_ddtree_spine": "--spine",
    "max_running_requests": "--max-running-requests",
    "tp_size": "--tp-size",
    "ep_size": "--ep-size",
    "max_context": "--max-context",
    "cuda_graph_bs": "--cuda-graph-bs",
    "host": "--host",
    "port": "--port",
}

TABLES = (FlagTable(VersionRange("0.1.0", "0.1.x"), FLAGS),)


def render(params: LaunchParams, target: LaunchTarget, out: Argv) -> None:
    """Write ``dflash-tune serve ...`` for ``params`` into ``out``."""
    _check_supported(params, out.label)
    out.raw(*target.head("dflash-tune", "serve"))
    out.add("target", target.model_path)
    out.add("speculative_algorithm", params.speculative_algorithm)
    if params.speculative:
        out.add("drafter", require_drafter(params, target, out.label))
        out.add("speculative_dflash_block_size", params.speculative_dflash_block_size)
    if params.is_ddtree:
        out.add("speculative_ddtree_budget", params.speculative_ddtree_budget)
        out.add("speculative_ddtree_topk", params.tree_width)
        out.add("speculative_ddtree_max_depth", params.tree_depth)
        if params.round_capped:
            out.add("speculative_ddtree_round_tokens", params.speculative_ddtree_round_tokens)
        if params.speculative_ddtree_spine:
            out.add("speculative_ddtree_spine")
    out.add("max_running_requests", params.max_running_requests)
    if params.tp_size > 1:
        out.add("tp_size", params.tp_size)
    if params.ep_size > 1:
        out.add("ep_size", params.ep_size)
    if target.context_length is not None:
        out.add("max_context", target.context_length)
    if params.cuda_graph:
        out.add("cuda_graph_bs", ",".join(map(str, params.capture_batch_sizes)))
    out.add("host", target.host)
    out.add("port", target.port)


def render_env(params: LaunchParams, table: FlagTable) -> dict[str, str]:
    """Serve's ranks all-reduce over NCCL on CUDA (gloo on CPU, which ignores these)."""
    return nccl_env(params)


# SGLang's and vLLM's knobs serve has no counterpart for.
_NOT_SERVE = {
    "disable_custom_all_reduce": "serve has no custom all-reduce; its ranks all-reduce with "
                                 "torch.distributed (NCCL) already",
    "decode_context_parallel_size": "serve keeps each request's KV cache whole on every rank",
    "cudagraph_mode": "it is vLLM's compilation setting; serve's graphs are cuda_graph and "
                      "cuda_graph_bs",
    "kv_cache_dtype": "serve keeps its KV cache in the model's dtype (SGLang and vLLM take "
                      "8-bit caches)",
}


def _check_supported(params: LaunchParams, label: str) -> None:
    if params.dp_size > 1 or params.enable_dp_attention:
        raise UnsupportedParams(
            f"{label} has no data parallelism: dp_size must be 1 and enable_dp_attention off")
    refuse_knobs(params, label, _NOT_SERVE)


def label(params: LaunchParams) -> str:
    """``TP2 dflash b6 graphs<=32 run48``: what serve reads (no memory fraction)."""
    block = params.speculative_dflash_block_size
    if params.is_ddtree:
        method = (f"ddtree b{block} B{params.speculative_ddtree_budget} "
                  f"k{params.tree_width} d{params.tree_depth}{params.round_label}")
    else:
        method = f"dflash b{block}" if params.speculative else "plain"
    graphs = f"graphs<={max(params.capture_batch_sizes)}" if params.cuda_graph else "eager"
    layout = (f"TP{params.tp_size} " if params.tp_size > 1 else "") + (
        f"EP{params.ep_size} " if params.ep_size > 1 else "")
    nccl = "".join(f" {k}={v}" for k, v in sorted(nccl_env(params).items()))
    return f"{layout}{method} {graphs} run{params.max_running_requests}{nccl}"


# DEFAULT_PORT is serve's own --port default (backends/dflash_server/cli.py).
DEFAULT_PORT = 8000
DIALECT = EngineDialect("dflash-tune serve", "0.1.0", TABLES, render, render_env,
                        default_port=DEFAULT_PORT, label=label)
