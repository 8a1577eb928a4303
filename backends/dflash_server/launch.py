"""Load the checkpoints, build the engine and its loop, and serve: the engine here, the HTTP
front end in its own process (front.py), or both in one (`--engine-thread`, the tests)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time

from backends.dflash_server.front import configure_logging, server_info, uvicorn_server
from backends.dflash_server.options import ServeOptions
from backends.launch_params import to_spec

log = logging.getLogger("dflash_tune.serve")


def build(options: ServeOptions, ranks_out: list | None = None):
    """-> (EngineLoop, ServerInfo): the engine and the front end in one process (the tests,
    `--engine-thread`). With tp_size > 1 the engine is rank 0's of ranks started here (appended
    to `ranks_out`, for the caller to close)."""
    return build_loop(options, ranks_out), server_info(options)


def build_loop(options: ServeOptions, ranks_out: list | None = None, after_round=None):
    """The EngineLoop, ready to start (EngineLoop's `after_round`)."""
    import torch

    from backends.dflash_server.loop import EngineLoop

    _, drafter, engine = _engine(options, ranks_out if ranks_out is not None else [])
    spec = to_spec(options, drafter.block_size if drafter else None, options.spine)
    if options.cuda_graph_bs and not engine.config.fixed_shapes:
        log.warning("--cuda-graph-bs %s on %s: rounds run padded to these batch sizes, without "
                    "CUDA graphs (they need a CUDA device) or --compile", options.cuda_graph_bs,
                    options.device)
    loop = EngineLoop(engine, spec, options.seed, after_round)
    if engine.config.fixed_shapes:  # before the first request, as servers do
        began = time.perf_counter()
        with torch.inference_mode():
            made = loop.batch.capture()
        what = "captured %d CUDA graphs" if engine.config.cuda_graphs else \
            f"compiled %d graphs ({engine.config.compile})"
        log.info(what + " in %.1f s", made, time.perf_counter() - began)
    return loop


def _engine(options: ServeOptions, ranks_out: list):
    """-> (target config, drafter config or None, engine). Rank 0 of several reads only the
    configs here: its weights are its shard, loaded by the ranks."""
    from dflash_core import DrafterConfig, build_engine, load_models
    from dflash_core.models.architectures import target_config
    from dflash_core.models.config import read_config

    if options.tp_size == 1:
        target, drafter = load_models(options.target, options.drafter, options.dtype,
                                      options.device)
        target_cfg, drafter_cfg = target.config, drafter and drafter.config
    else:
        target_cfg = target_config(read_config(options.target))  # Qwen3 or DeepSeek
        drafter_cfg = DrafterConfig.from_dict(read_config(options.drafter)) \
            if options.drafter else None
    spec = to_spec(options, drafter_cfg.block_size if drafter_cfg else None, options.spine)
    limits = dict(max_batch=options.max_running_requests, max_context=options.max_context,
                  max_tree_nodes=spec.num_nodes, batch_buckets=tuple(options.cuda_graph_bs),
                  compile=options.compile)
    if options.tp_size == 1:
        return target_cfg, drafter_cfg, build_engine(target, drafter, **limits)
    from dflash_core.parallel.layout import Layout
    from dflash_core.parallel.ranks import EngineRecipe, Ranks

    recipe = EngineRecipe(options.target, options.drafter,
                          Layout(options.tp_size, options.ep_size), options.dtype,
                          options.device, limits)
    ranks_out.append(Ranks(recipe, exit_on_death=True))
    return target_cfg, drafter_cfg, ranks_out[-1].engine


def serve(options: ServeOptions) -> None:
    """Serve until stopped: the engine here, the front end in its own process (front.py), or
    both in this one with `engine_thread`."""
    configure_logging(options.log_level)
    if options.device == "cpu":  # this process's engine; ranks (tp > 1) set their own
        import torch

        if threads := options.engine_threads():
            torch.set_num_threads(threads)
        print(f"dflash-tune serve: engine on {torch.get_num_threads()} torch threads",
              file=sys.stderr, flush=True)
    ranks: list = []
    try:
        if options.engine_thread:
            _serve_in_process(options, ranks)
        else:
            code = serve_engine(options, ranks)
            if code:
                sys.exit(code)
    finally:
        for handle in ranks:
            handle.close()


def _serve_in_process(options: ServeOptions, ranks: list) -> None:
    from backends.dflash_server.app import build_app

    loop, info = build(options, ranks)
    loop.start()
    try:
        uvicorn_server(options, build_app(loop, info)).run()
    finally:
        loop.stop()


def serve_engine(options: ServeOptions, ranks: list) -> int:
    """The engine process: build the engine, start the front end, run rounds until the front
    end exits (a stop signal here is passed on to it). -> the exit code: the front end's, 1
    when it was killed."""
    import multiprocessing

    from backends.dflash_server.bridge import EngineBridge
    from backends.dflash_server.front import run_front

    ours, theirs = multiprocessing.Pipe()
    bridge = EngineBridge(ours)
    loop = build_loop(options, ranks, bridge.after_round)
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
