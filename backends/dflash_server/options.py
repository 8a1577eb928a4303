"""`dflash-tune serve`'s launch options, shared by the engine and front-end processes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from backends.engine_builder import Checkpoints, EngineRuntime, speculation
from backends.engine_limits import check_serving_context
from backends.errors import UserError
from backends.launch_params import LaunchParams

MAX_PORT = 65535
# Hostile clients: a body past MAX_BODY_BYTES is a 413; a connection that has not sent its request
# headers within HEADER_TIMEOUT_S, or its body within BODY_TIMEOUT_S, is dropped (408 for the
# body); past MAX_CONNECTIONS open ones, the oldest idle one is closed for each new one.
MAX_BODY_BYTES = 16 * 2**20  # a prompt of 100k+ tokens, JSON-escaped, fits several times
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 1000  # lowered to what the open-file limit leaves, if below
SHUTDOWN_GRACE_S = 5.0  # once stopping, how long the requests in flight may still run


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
    max_body_bytes: int = MAX_BODY_BYTES
    header_timeout: float = HEADER_TIMEOUT_S
    body_timeout: float = BODY_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    shutdown_grace: float = SHUTDOWN_GRACE_S

    def check(self) -> None:
        """A UserError (one line) for a setting the server cannot run with, before anything is
        loaded or bound."""
        from dflash_core.models.config import read_config
        from dflash_core.training.tokenizer import load_tokenizer

        if not 0 <= self.port <= MAX_PORT:
            raise UserError(f"--port must be 0..{MAX_PORT}, got {self.port}")
        for flag, value in (("--max-body-bytes", self.max_body_bytes),
                            ("--max-connections", self.max_connections),
                            ("--header-timeout", self.header_timeout),
                            ("--body-timeout", self.body_timeout)):
            if not 0 < value < float("inf"):
                raise UserError(f"{flag} must be a positive number, got {value}")
        if not 0 <= self.shutdown_grace < float("inf"):
            raise UserError(f"--shutdown-grace must be 0 or more seconds, got "
                            f"{self.shutdown_grace}")
        positions = read_config(self.target).get("max_position_embeddings")
        check_serving_context(self.max_context, positions,
                              speculation(self.launch, self.checkpoints))
        load_tokenizer(self.target)  # the front end's: unreadable, it is one line here

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
