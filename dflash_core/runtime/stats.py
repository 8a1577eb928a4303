"""What a generate call reports besides tokens."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from dflash_core.parallel.traffic import Traffic

# "round": a whole round replayed as a CUDA graph (its stages cannot be timed apart).
STAGES = ("prefill", "draft", "build", "verify", "accept", "commit", "round")


@dataclass(slots=True)
class GenerationStats:
    rounds: int = 0
    acceptance: Counter = field(default_factory=Counter)  # tau (accepted + bonus) -> request-rounds
    # Seconds per stage, every STAGES key present; all zeros unless EngineConfig.stage_timing.
    stage_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    generated_tokens: int = 0
    wall_s: float = 0.0
    # Collectives this rank's rounds ran, by kind (prefill excluded); empty on one device.
    comm: Traffic = field(default_factory=Traffic)

    @property
    def mean_acceptance(self) -> float:
        """Mean tokens per request-round (DFlash's tau), bonus included."""
        total = sum(self.acceptance.values())
        return sum(k * n for k, n in self.acceptance.items()) / total if total else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s else 0.0

    @contextmanager
    def timed(self, stage: str, device: torch.device, on: bool = True) -> Iterator[None]:
        """Add the stage's time to stage_s when `on`; off, record nothing rather than a launch
        time that would pass for a GPU stage time (honest ones need a sync at each boundary)."""
        if not on:
            yield
            return
        start = time.perf_counter()
        yield
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.stage_s[stage] += time.perf_counter() - start


@dataclass(slots=True)
class Generation:
    tokens: list[list[int]]  # generated tokens per request (prompt excluded)
    finish_reasons: list[str]  # "stop", "max_tokens" or "length" (context full)
    stats: GenerationStats
