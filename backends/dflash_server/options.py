"""`dflash-tune serve`'s launch options, shared by the engine and front-end processes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from backends.engine_builder import Checkpoints, EngineRuntime
from backends.launch_params import LaunchParams


@dataclass(slots=True)
class ServeOptions:
    """What to serve (the checkpoints and the launch: the one record of the tuned knobs), how
    this machine runs it (`runtime`), and the server's own settings."""

    target: Path
    drafter: Path | None = None
    launch: LaunchParams = field(default_factory=lambda: LaunchParams(tp_size=1,
                                                                      cuda_graph=False))
    runtime: EngineRuntime = field(default_factory=EngineRuntime)
    max_context: int = 2048
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    seed: int = 0
    log_level: str = "warning"  # uvicorn's levels; "info" adds the access log
    engine_thread: bool = False  # the engine loop as a thread of the HTTP process (no split)

    @property
    def checkpoints(self) -> Checkpoints:
        return Checkpoints(Path(self.target), self.drafter and Path(self.drafter))

    def engine_threads(self) -> int | None:
        """The runtime's threads; else torch's own if OMP_NUM_THREADS says; else one per core
        but one. On a CPU the engine computes on the cores that also run the HTTP front end
        (and, in a benchmark, the load generator), so one core is left to them, as vLLM's CPU
        build reserves one for its API server: an OpenMP thread that finds its core taken
        spin-waits, and every thread of the forward waits for it (docs/BENCHMARKS.md)."""
        if self.runtime.threads or os.environ.get("OMP_NUM_THREADS"):
            return self.runtime.threads
        return max(1, len(os.sched_getaffinity(0)) - 1)
