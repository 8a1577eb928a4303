"""The server's command line: `python -m backends.dflash_server ...`, which `dflash-tune serve`
registers as is. Option spellings come from the dflash flag table, so what the tuner renders is
exactly what this parses; the Python names are the tuning names."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from backends.flags.dflash import FLAGS
from dflash_core.speculation.spec import METHODS

Method = Enum("Method", {m: m for m in METHODS}, type=str)
LogLevel = Enum("LogLevel", {level: level for level in (
    "critical", "error", "warning", "info", "debug", "trace")}, type=str)  # uvicorn's


def option(knob: str, help: str, *aliases: str):
    """A command-line option for ``knob``, spelled as the flag table says (and `aliases`)."""
    return typer.Option(FLAGS[knob], *aliases, help=help)


# The speculation options, declared once for `serve` and `generate` (tuner/engine_cli.py).
Drafter = Annotated[Path | None, option("drafter", "DFlash drafter checkpoint folder.")]
Algorithm = Annotated[Method | None, option(
    "speculative_algorithm", "Speculation method (default: dflash with a drafter, else none).")]
BlockSize = Annotated[int | None, option(
    "speculative_dflash_block_size", "Block size (default: the drafter's trained block).")]
Budget = Annotated[int, option("speculative_ddtree_budget",
                               "DDTree node budget (root excluded).")]
TopK = Annotated[int, option("speculative_ddtree_topk",
                             "DDTree candidates per depth (0 = no cap).")]
MaxDepth = Annotated[int, option("speculative_ddtree_max_depth",
                                 "DDTree max depth (0 = block - 1).")]
RoundTokens = Annotated[int, option(
    "speculative_ddtree_round_tokens",
    "DDTree: verify tokens a round may spend over all its rows (0 = no cap); at higher load "
    "each row's tree shrinks to round-tokens / rows - 1 nodes, never below block - 1.")]
Spine = Annotated[bool, typer.Option(help="DDTree: greedy chain first.")]
# The layout, declared once for `serve` and `generate`: SGLang's meaning and spellings.
TpSize = Annotated[int, option("tp_size", "Ranks (processes) the target is split over: "
                                          "attention heads, MLPs, vocabulary.", "--tp")]
EpSize = Annotated[int, option("ep_size", "Expert groups among the tp ranks (divides tp): "
                                          "routed experts split over them.", "--ep")]
Compile = Annotated[str, typer.Option(help=(
    "The round (verify, draft, DDTree build) and the prefill through torch.compile: none "
    "(eager), inductor, max-autotune (Inductor also picks each GEMM's kernel by timing: a "
    "longer warm-up), or eager (Dynamo trace only). `serve` compiles every shape before it "
    "listens (bound them with --cuda-graph-bs); `generate` in its warm-up run. On a CPU with "
    "AMX, pair it with --dtype bfloat16."))]


def serve(
        target: Annotated[Path, option("target", "Target checkpoint folder (with a "
                                                 "tokenizer.json).")],
        drafter: Drafter = None, speculative_algorithm: Algorithm = None,
        speculative_dflash_block_size: BlockSize = None, speculative_ddtree_budget: Budget = 32,
        speculative_ddtree_topk: TopK = 0, speculative_ddtree_max_depth: MaxDepth = 0,
        speculative_ddtree_round_tokens: RoundTokens = 0, spine: Spine = False,
        max_running_requests: Annotated[int, option(
            "max_running_requests", "Rows of the engine's batch (continuous batching).")] = 8,
        max_context: Annotated[int, option(
            "max_context", "Prompt + output tokens per request.")] = 2048,
        cuda_graph_bs: Annotated[str, option(
            "cuda_graph_bs", "CUDA graph batch sizes, e.g. '1,2,4,8': rounds run padded to "
            "these sizes and, on a CUDA device, replay captured graphs (with --compile: one "
            "compiled graph per size). Empty: eager.")] = "",
        host: Annotated[str, option("host", "Address to bind.")] = "127.0.0.1",
        port: Annotated[int, option("port", "Port to bind.")] = 8000,
        device: Annotated[str, typer.Option(help="cpu, cuda, cuda:1, ...")] = "cpu",
        dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
        served_model_name: str | None = None, seed: int = 0,
        tp_size: TpSize = 1, ep_size: EpSize = 1,
        log_level: Annotated[LogLevel, typer.Option(
            help="uvicorn's log level; info adds the access log. The line saying where the "
                 "server listens is printed at every level.")] = LogLevel.warning,
        compile: Compile = "none",
        engine_thread: Annotated[bool, typer.Option(help=(
            "Run the engine loop as a thread of the HTTP process instead of in its own "
            "process (one GIL for both; for comparison)."))] = False,
        threads: Annotated[int | None, typer.Option(min=1, help=(
            "Torch threads of the engine on a CPU. Default: OMP_NUM_THREADS if set, else "
            "one per core but one, which is left to the HTTP front end."))] = None) -> None:
    """Serve the dflash_core engine over an OpenAI-compatible HTTP API."""
    from backends.local_engine import require_engine

    require_engine()
    from backends.dflash_server.launch import ServeOptions
    from backends.dflash_server.launch import serve as run_server

    chosen = speculative_algorithm.value if speculative_algorithm else (
        "dflash" if drafter else "none")
    graphs = [int(b) for b in cuda_graph_bs.replace(",", " ").split()]
    run_server(ServeOptions(
        target, drafter, chosen, speculative_dflash_block_size, speculative_ddtree_budget,
        speculative_ddtree_topk, speculative_ddtree_max_depth, speculative_ddtree_round_tokens,
        spine, max_running_requests,
        max_context, graphs, host, port, device, dtype, served_model_name, seed,
        log_level.value, tp_size, ep_size, compile, engine_thread, threads))


def main() -> None:
    # A refused configuration ends in its traceback: the "ValueError: ..." line is what the
    # failure classifier reads from a server's log, as it does from any engine's.
    typer.run(serve)
