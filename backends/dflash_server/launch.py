"""Load the checkpoints, build the engine and its loop, and serve the app under uvicorn."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger("dflash_tune.serve")


@dataclass(slots=True)
class ServeOptions:
    """Launch options; the speculation ones mirror the tuning parameters."""

    target: Path
    drafter: Path | None = None
    method: str = "none"  # none | dflash | ddtree
    block_size: int | None = None  # default: the drafter's trained block
    budget: int = 32
    width: int = 0
    depth: int = 0
    spine: bool = False
    max_running_requests: int = 8
    max_context: int = 2048
    cuda_graph_bs: list[int] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "cpu"
    dtype: str = "float32"
    served_model_name: str | None = None
    seed: int = 0


def build(options: ServeOptions):
    """-> (EngineLoop, ServerInfo), ready to serve."""
    import torch
    from tokenizers import Tokenizer

    from backends.dflash_server.app import ServerInfo
    from backends.dflash_server.loop import EngineLoop
    from dflash_core import DFlashProposer, Engine, EngineConfig, load_drafter, load_target
    from dflash_core.spec import spec_for

    dtype = getattr(torch, options.dtype)
    target = load_target(options.target, dtype, options.device)
    drafter = (load_drafter(options.drafter, target.config, dtype, options.device)
               if options.drafter else None)
    spec = spec_for(options.method, drafter.config.block_size if drafter else None,
                    options.block_size, options.budget, options.width, options.depth,
                    options.spine)
    graphs = bool(options.cuda_graph_bs) and options.device.startswith("cuda")
    config = EngineConfig(max_batch=options.max_running_requests,
                          max_context=options.max_context, max_tree_nodes=spec.num_nodes,
                          batch_buckets=tuple(options.cuda_graph_bs), cuda_graphs=graphs)
    engine = Engine(target, DFlashProposer(drafter, target) if drafter else None, config)
    tokenizer_path = Path(options.target) / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise FileNotFoundError(f"{tokenizer_path} not found (the server needs a tokenizer)")
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    if options.cuda_graph_bs and not graphs:
        log.warning("--cuda-graph-bs %s on %s: rounds run padded to these batch sizes, without "
                    "CUDA graphs (they need a CUDA device)", options.cuda_graph_bs,
                    options.device)
    info = ServerInfo(options.served_model_name or Path(options.target).name, tokenizer,
                      tokenizer.token_to_id("<|endoftext|>"), options.max_context,
                      {k: str(v) if isinstance(v, Path) else v
                       for k, v in asdict(options).items()})
    loop = EngineLoop(engine, spec, options.seed)
    if graphs:  # before the first request, as servers do; sampling modes are captured lazily
        began = time.perf_counter()
        with torch.inference_mode():
            made = loop.batch.capture()
        log.info("captured %d CUDA graphs in %.1f s", made, time.perf_counter() - began)
    return loop, info


def serve(options: ServeOptions) -> None:
    import uvicorn

    from backends.dflash_server.app import build_app

    loop, info = build(options)
    loop.start()
    try:
        uvicorn.run(build_app(loop, info), host=options.host, port=options.port,
                    log_level="warning", timeout_graceful_shutdown=5)
    finally:
        loop.stop()
