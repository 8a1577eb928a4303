"""The server's command line: `python -m backends.dflash_server ...`, which `dflash-tune serve`
registers as is. The launch's options are made from LaunchParams (backends.launch_cli): the
tuning names, with the spellings the tuner renders (backends.flags.dflash.FLAGS) as aliases,
so what the tuner renders is exactly what this parses."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from backends.dflash_server import options as serve_options
from backends.flags.dflash import FLAGS
from backends.launch_cli import ENGINE_DEFAULTS, ENGINE_DERIVED, launch_options
from backends.launch_params import SPECULATION_KNOBS

LogLevel = Enum("LogLevel", {level: level for level in (
    "critical", "error", "warning", "info", "debug", "trace")}, type=str)  # uvicorn's
# The knobs serve takes: every LaunchParams field its flag table spells.
SERVE_KNOBS = (*SPECULATION_KNOBS, "max_running_requests", "tp_size", "ep_size",
               "cuda_graph_bs")


def option(knob: str, help: str, *aliases: str):
    """A command-line option for ``knob``, spelled as the flag table says (and `aliases`)."""
    return typer.Option(FLAGS[knob], *aliases, help=help)


# The options of how this machine runs the engine, declared once for `serve` and `generate`.
Drafter = Annotated[Path | None, option("drafter", "DFlash drafter checkpoint folder.")]
Device = Annotated[str, typer.Option(help="cpu, cuda, cuda:1, ...")]
Dtype = Annotated[str, typer.Option(help="float32, bfloat16 or float16.")]
Compile = Annotated[str, typer.Option(help=(
    "The round (verify, draft, DDTree build) and the prefill through torch.compile: none "
    "(eager), inductor, max-autotune (Inductor also picks each GEMM's kernel by timing: a "
    "longer warm-up), or eager (Dynamo trace only). `serve` compiles every shape before it "
    "listens (bound them with --cuda-graph-bs); `generate` in its warm-up run. On a CPU with "
    "AMX, pair it with --dtype bfloat16."))]


@launch_options(SERVE_KNOBS, ENGINE_DEFAULTS, ENGINE_DERIVED)
def serve(
        target: Annotated[Path, option("target", "Target checkpoint folder (with a "
                                                 "tokenizer.json).")],
        drafter: Drafter = None,
        max_context: Annotated[int, option(
            "max_context", "Prompt + output tokens per request.")] = 2048,
        host: Annotated[str, option("host", "Address to bind.")] = "127.0.0.1",
        port: Annotated[int, option("port", "Port to bind.")] = 8000,
        device: Device = "cpu", dtype: Dtype = "float32",
        served_model_name: str | None = None, seed: int = 0,
        log_level: Annotated[LogLevel, typer.Option(
            help="uvicorn's log level; info adds the access log. The line saying where the "
                 "server listens is printed at every level.")] = LogLevel.warning,
        compile: Compile = "none",
        engine_thread: Annotated[bool, typer.Option(help=(
            "Run the engine loop as a thread of the HTTP process instead of in its own "
            "process (one GIL for both; for comparison)."))] = False,
        threads: Annotated[int | None, typer.Option(min=1, help=(
            "Torch threads of the engine on a CPU. Default: OMP_NUM_THREADS if set, else "
            "one per core but one, which is left to the HTTP front end."))] = None,
        max_body_bytes: Annotated[int, typer.Option(help=(
            "Largest request body taken; a larger one is a 413, refused from its "
            "Content-Length before it is read."))] = serve_options.MAX_BODY_BYTES,
        max_connections: Annotated[int, typer.Option(help=(
            "Open connections kept; past it the oldest idle one is closed for each new one. "
            "Lowered to the open-file limit less 64 if that is smaller."))] =
        serve_options.MAX_CONNECTIONS,
        header_timeout: Annotated[float, typer.Option(help=(
            "Seconds a connection may take to send a request's headers before it is "
            "closed."))] = serve_options.HEADER_TIMEOUT_S,
        body_timeout: Annotated[float, typer.Option(help=(
            "Seconds a request may take to send its body (a 408 after)."))] =
        serve_options.BODY_TIMEOUT_S,
        shutdown_grace: Annotated[float, typer.Option(help=(
            "Seconds the requests in flight may still run once the server is told to stop "
            "(SIGTERM, SIGINT); new ones are refused (503) from the start, and those left at "
            "the end get an error event."))] = serve_options.SHUTDOWN_GRACE_S,
        *, launch: dict[str, Any]) -> None:
    """Serve the dflash_core engine over an OpenAI-compatible HTTP API."""
    from backends.local_engine import require_engine

    require_engine()
    from backends.dflash_server.launch import serve as run_server
    from backends.engine_builder import EngineRuntime
    from backends.launch_cli import engine_launch

    run_server(serve_options.ServeOptions(
        target, drafter, engine_launch(launch, drafter),
        EngineRuntime(device, dtype, compile, threads), max_context=max_context, host=host,
        port=port, served_model_name=served_model_name, seed=seed, log_level=log_level.value,
        engine_thread=engine_thread, max_body_bytes=max_body_bytes,
        max_connections=max_connections, header_timeout=header_timeout,
        body_timeout=body_timeout, shutdown_grace=shutdown_grace))


def main() -> None:
    """A setting the user can fix (a UserError, or an option click cannot parse) is one line
    and exit 2; anything else ends in its plain traceback (Rich's boxed one splits lines). The
    "...Error: ..." line is what the failure classifier reads from a server's log, as it does
    from any engine's."""
    from backends.errors import is_user_error

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    app.command()(serve)
    try:
        sys.exit(app(standalone_mode=False))
    except typer.TyperException as error:  # click's: an unknown option, a value it cannot parse
        _refuse(f"{type(error).__name__}: {error.format_message()}")
    except Exception as error:
        if not is_user_error(error):
            raise
        _refuse(f"{type(error).__name__}: {error}")


def _refuse(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
    sys.exit(2)
