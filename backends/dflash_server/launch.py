"""Load the checkpoints, build the engine and its loop, and serve: the engine here, the HTTP
front end in its own process (front.py), or both in one (`--engine-thread`, the tests)."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time

from backends.dflash_server.front import configure_logging, http_server, server_info
from backends.dflash_server.options import ServeOptions
from backends.engine_builder import open_engine

log = logging.getLogger("dflash_tune.serve")


def build(options: ServeOptions, stack: contextlib.ExitStack | None = None):
    """-> (EngineLoop, ServerInfo): the engine and the front end in one process (the tests,
    `--engine-thread`). With tp_size > 1 the engine is rank 0's of ranks that `stack` stops."""
    return build_loop(options, stack), server_info(options)


def build_loop(options: ServeOptions, stack: contextlib.ExitStack | None = None,
               after_round=None):
    """The EngineLoop, ready to start (EngineLoop's `after_round`); its ranks, if any, are
    stopped when `stack` closes."""
    import torch

    from backends.dflash_server.loop import EngineLoop

    stack = stack if stack is not None else contextlib.ExitStack()
    opened = stack.enter_context(open_engine(
        options.launch, options.checkpoints, options.runtime, max_context=options.max_context,
        exit_on_death=True))
    engine = opened.engine
    if options.launch.capture_batch_sizes and not engine.config.fixed_shapes:
        log.warning("--cuda-graph-bs %s on %s: rounds run padded to these batch sizes, without "
                    "CUDA graphs (they need a CUDA device) or --compile",
                    ",".join(map(str, options.launch.capture_batch_sizes)),
                    options.runtime.device)
    loop = EngineLoop(engine, opened.spec, options.seed, after_round)
    if engine.config.fixed_shapes:  # before the first request, as servers do
        began = time.perf_counter()
        with torch.inference_mode():
            made = loop.batch.capture()
        what = "captured %d CUDA graphs" if engine.config.cuda_graphs else \
            f"compiled %d graphs ({engine.config.compile})"
        log.info(what + " in %.1f s", made, time.perf_counter() - began)
    return loop


def serve(options: ServeOptions) -> None:
    """Serve until stopped: the engine here, the front end in its own process (front.py), or
    both in this one with `engine_thread`."""
    options.check()
    configure_logging(options.log_level)
    if options.runtime.device == "cpu":  # this process's engine; ranks (tp > 1) set their own
        import torch

        if threads := options.engine_threads():
            torch.set_num_threads(threads)
        print(f"dflash-tune serve: engine on {torch.get_num_threads()} torch threads",
              file=sys.stderr, flush=True)
    with contextlib.ExitStack() as stack:
        if options.engine_thread:
            _serve_in_process(options, stack)
        else:
            code = serve_engine(options, stack)
            if code:
                sys.exit(code)
    print("dflash-tune serve: stopped", file=sys.stderr, flush=True)


def _serve_in_process(options: ServeOptions, stack: contextlib.ExitStack) -> None:
    loop, info = build(options, stack)
    loop.start()
    try:
        http_server(options, loop, info).run()
    finally:
        loop.stop()


def serve_engine(options: ServeOptions, stack: contextlib.ExitStack) -> int:
    """The engine process: build the engine, start the front end, run rounds until the front
    end exits (a stop signal here is passed on to it). -> the exit code: the front end's, 1
    when it was killed."""
    import multiprocessing

    from backends.dflash_server.bridge import EngineBridge
    from backends.dflash_server.front import run_front

    ours, theirs = multiprocessing.Pipe()
    bridge = EngineBridge(ours)
    loop = build_loop(options, stack, bridge.after_round)
    # spawn, not fork: this process holds torch's thread pool and the ranks' watchdog thread.
    front = multiprocessing.get_context("spawn").Process(
        target=run_front, args=(options, theirs), name="dflash-front")
    stopping = _stop_signals()
    front.start()
    theirs.close()  # the front end's alone, so its exit reads as EOF here and ours as EOF there
    bridge.start(loop)
    loop.start()
    try:
        while front.is_alive():
            front.join(0.2)
            if stopping.is_set():
                front.terminate()  # uvicorn's graceful stop; a second SIGTERM changes nothing
                stopping.clear()
    finally:
        loop.stop()
        ours.close()
    code = front.exitcode
    if code:
        print(f"dflash-tune serve: the front-end process exited (code {code}); the engine "
              "stops with it", file=sys.stderr, flush=True)
    return code if code is None or code >= 0 else 1


def _stop_signals() -> threading.Event:
    """SIGTERM and SIGINT set the event instead of ending the engine mid-round."""
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    return stopping
