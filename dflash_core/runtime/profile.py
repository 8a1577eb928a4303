"""Per-stage profile of decode rounds: wall time, ATen ops launched and time inside them.

Wall times on a shared CPU are noisy; the number of ATen ops a stage dispatches is not, and on a
small model it is what a round costs (each op pays the dispatcher and, on a GPU, a launch). So
`profile_rounds` runs rounds twice: once plain, timing every stage (the wall time), once under
`OpCounter`, a TorchDispatchMode that counts each op a stage dispatches and times it (compiled
parts run eagerly there, so a compiled stage's count is its eager op count). A stage's
host time is its wall time less the time inside its ops (its Python and bookkeeping); "host"
is the live batch's own bookkeeping around the round (packet read, emit, row lists).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dflash_core.runtime.batch import LiveBatch
from dflash_core.runtime.stats import GenerationStats

HOST = "host"


class OpCounter(TorchDispatchMode):
    """Counts and times the ATen ops dispatched while `stage` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.stage = HOST
        self.ops: Counter = Counter()  # stage -> ops
        self.op_s: Counter = Counter()  # stage -> seconds inside ops
        self.names: Counter = Counter()  # (stage, op name) -> ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        began = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.op_s[self.stage] += time.perf_counter() - began
        self.ops[self.stage] += 1
        self.names[self.stage, func.__name__] += 1
        return out

    @contextmanager
    def staged(self, stage: str) -> Iterator[None]:
        outer, self.stage = self.stage, stage
        try:
            yield
        finally:
            self.stage = outer


@dataclass(slots=True)
class StageProfile:
    wall_ms: float  # per round
    ops: float  # ATen ops per round
    op_ms: float  # per round, inside those ops (under the counter, so a little inflated)

    @property
    def host_ms(self) -> float:
        return max(self.wall_ms - self.op_ms, 0.0)


@dataclass(slots=True)
class RoundProfile:
    rounds: int
    stages: dict[str, StageProfile] = field(default_factory=dict)
    top_ops: list[tuple[str, str, float]] = field(default_factory=list)  # stage, op, per round

    @property
    def total(self) -> StageProfile:
        parts = self.stages.values()
        return StageProfile(sum(p.wall_ms for p in parts), sum(p.ops for p in parts),
                            sum(p.op_ms for p in parts))


class _CountedStats(GenerationStats):
    """GenerationStats whose stage timer also tells the op counter which stage is running."""

    __slots__ = ("counter",)

    @contextmanager
    def timed(self, stage: str, device: torch.device, on: bool = True) -> Iterator[None]:
        with self.counter.staged(stage), GenerationStats.timed(self, stage, device, on):
            yield


def _timed_rounds(batch: LiveBatch, rounds: int) -> tuple[dict[str, float], int]:
    """Stage seconds over `rounds` steps (host = step wall time less its stages), rounds run."""
    before = dict(batch.stats.stage_s)
    step_s, ran = 0.0, 0
    for _ in range(rounds):
        if not batch.live_rows():
            break
        began = time.perf_counter()
        batch.step()
        step_s += time.perf_counter() - began
        ran += 1
    spent = {k: v - before[k] for k, v in batch.stats.stage_s.items() if v - before[k] > 0}
    spent[HOST] = step_s - sum(spent.values())
    return spent, ran


def profile_rounds(batch: LiveBatch, rounds: int) -> RoundProfile:
    """Profile `rounds` steps of an admitted batch (it must keep live rows for 2 x rounds:
    timed rounds first, then counted ones). Turns the batch's stage timing on."""
    batch.stage_timing = True
    wall, ran = _timed_rounds(batch, rounds)
    counter = OpCounter()
    stats = _CountedStats()
    stats.counter = counter
    plain, batch.stats, batch.round.stats = batch.stats, stats, stats
    try:
        # Compiled parts run eagerly while counted: under a dispatch mode Dynamo would compile
        # them again for the mode, and the graphs it keeps then ran the later timed rounds
        # 1.4-2.7x slower (the verify and the build, measured by a probe timing them before and
        # after a counted pass; docs/BENCHMARKS.md, "Round profile"). So the counts are each
        # stage's eager ATen ops.
        with torch.compiler.set_stance("force_eager"), counter:
            _, counted = _timed_rounds(batch, rounds)
    finally:
        plain.rounds += stats.rounds
        batch.stats, batch.round.stats = plain, plain
    profile = RoundProfile(ran)
    for stage in [s for s in (*stats.stage_s, HOST) if s in wall or counter.ops[s]]:
        profile.stages[stage] = StageProfile(1e3 * wall.get(stage, 0.0) / max(ran, 1),
                                             counter.ops[stage] / max(counted, 1),
                                             1e3 * counter.op_s[stage] / max(counted, 1))
    profile.top_ops = [(s, op, n / max(counted, 1)) for (s, op), n in counter.names.most_common(12)]
    return profile
