"""Load the checkpoints, build the engine and its loop, and serve the app under uvicorn."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from backends.launch_params import to_spec

log = logging.getLogger("dflash_tune.serve")


@dataclass(slots=True)
class ServeOptions:
    """Launch options. The speculation knobs carry the tuning names (LaunchParams fields);
    `backends.flags.dflash.FLAGS` spells them on the command line."""

    target: Path
    drafter: Path | None = None
    speculative_algorithm: str = "none"  # none | dflash | ddtree
    speculative_dflash_block_size: int | None = None  # None: the drafter's trained block
    speculative_ddtree_budget: int = 32
    speculative_ddtree_topk: int = 0  # 0: no cap (a depth never holds more than the budget)
    speculative_ddtree_max_depth: int = 0  # 0: block size - 1
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
    from dflash_core import build_engine, load_models

    target, drafter = load_models(options.target, options.drafter, options.dtype,
                                  options.device)
    spec = to_spec(options, drafter.config.block_size if drafter else None, options.spine)
    engine = build_engine(target, drafter, max_batch=options.max_running_requests,
                          max_context=options.max_context, max_tree_nodes=spec.num_nodes,
                          batch_buckets=tuple(options.cuda_graph_bs))
    tokenizer = Tokenizer.from_file(str(_tokenizer_path(options.target)))
    if options.cuda_graph_bs and not engine.config.cuda_graphs:
        log.warning("--cuda-graph-bs %s on %s: rounds run padded to these batch sizes, without "
                    "CUDA graphs (they need a CUDA device)", options.cuda_graph_bs,
                    options.device)
    info = ServerInfo(options.served_model_name or Path(options.target).name, tokenizer,
                      tokenizer.token_to_id("<|endoftext|>"), options.max_context,
                      {k: str(v) if isinstance(v, Path) else v
                       for k, v in asdict(options).items()})
    loop = EngineLoop(engine, spec, options.seed)
    if engine.config.cuda_graphs:  # before the first request, as servers do
        began = time.perf_counter()
        with torch.inference_mode():
            made = loop.batch.capture()
        log.info("captured %d CUDA graphs in %.1f s", made, time.perf_counter() - began)
    return loop, info


def _tokenizer_path(target: Path) -> Path:
    path = Path(target) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (the server needs a tokenizer)")
    return path


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
