"""`dflash-tune serve` launch flags (this project's own server over dflash_core).

One GPU (or the CPU) per server: tensor, data and expert parallelism are not expressible. DDTree
is native: budget -> --budget, top-k -> --width, max depth -> --depth.
"""

from __future__ import annotations

from backends.flags._dialect import Argv
from backends.flags._dialect import EngineDialect
from backends.flags._dialect import FlagTable
from backends.flags._dialect import LaunchTarget
from backends.flags._dialect import UnsupportedParams
from backends.flags._dialect import require_drafter
from backends.flags._versions import VersionRange
from backends.launch_params import LaunchParams

_FLAGS = {
    "target": "--target",
    "drafter": "--drafter",
    "method": "--method",
    "block_size": "--block-size",
    "budget": "--budget",
    "width": "--width",
    "depth": "--depth",
    "max_running_requests": "--max-running-requests",
    "max_context": "--max-context",
    "cuda_graph_bs": "--cuda-graph-bs",
    "host": "--host",
    "port": "--port",
}

TABLES = (FlagTable(VersionRange("0.1.0", "0.1.x"), _FLAGS),)


def render(params: LaunchParams, target: LaunchTarget, out: Argv) -> None:
    """Write ``dflash-tune serve ...`` for ``params`` into ``out``."""
    _check_supported(params, out.label)
    out.raw("dflash-tune", "serve")
    out.add("target", target.model_path)
    out.add("method", params.speculative_algorithm)
    if params.speculative:
        out.add("drafter", require_drafter(params, target, out.label))
        out.add("block_size", params.speculative_dflash_block_size)
    if params.is_ddtree:
        out.add("budget", params.speculative_ddtree_budget)
        out.add("width", params.speculative_ddtree_topk)
        out.add("depth", params.tree_depth)
    out.add("max_running_requests", params.max_running_requests)
    if target.context_length is not None:
        out.add("max_context", target.context_length)
    if params.cuda_graph:
        out.add("cuda_graph_bs", ",".join(map(str, params.capture_batch_sizes)))
    out.add("host", target.host)
    out.add("port", target.port)


def render_env(params: LaunchParams, table: FlagTable) -> dict[str, str]:
    return {}


def _check_supported(params: LaunchParams, label: str) -> None:
    if params.gpus > 1 or params.ep_size > 1 or params.enable_dp_attention:
        raise UnsupportedParams(
            f"{label} runs on one device: tp_size, dp_size and ep_size must be 1 and "
            "enable_dp_attention off")


DIALECT = EngineDialect("dflash-tune serve", "0.1.0", TABLES, render, render_env)
