"""`dflash-tune serve`'s launch options, shared by the engine and front-end processes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


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
    speculative_ddtree_round_tokens: int = 0  # 0: the tree's budget at every load
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
    log_level: str = "warning"  # uvicorn's levels; "info" adds the access log
    tp_size: int = 1  # ranks (processes) the target is split over (LaunchParams' names)
    ep_size: int = 1  # expert groups among them
    compile: str = "none"  # EngineConfig.compile
    engine_thread: bool = False  # the engine loop as a thread of the HTTP process (no split)
    # torch threads of the engine on a CPU; None: engine_threads' default
    threads: int | None = None

    def engine_threads(self) -> int | None:
        """`threads`; else torch's own if OMP_NUM_THREADS says; else one per core but one.
        On a CPU the engine computes on the cores that also run the HTTP front end (and, in a
        benchmark, the load generator), so one core is left to them, as vLLM's CPU build
        reserves one for its API server: an OpenMP thread that finds its core taken
        spin-waits, and every thread of the forward waits for it (docs/BENCHMARKS.md)."""
        if self.threads or os.environ.get("OMP_NUM_THREADS"):
            return self.threads
        return max(1, len(os.sched_getaffinity(0)) - 1)
