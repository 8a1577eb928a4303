"""The ``simulated`` backend: a node that behaves like the performance model says, measured the
way a real node is (noisily), and launched at a real node's cost (minutes).

It exists to develop and benchmark the tuner's launch and noise handling without a GPU: the
truth is known (the noiseless model), so how close a tuner gets and how many launches it spent
are both measurable. Time is virtual: sessions add what a launch and a level would have taken
to their clocks; ``real_time`` > 0 also sleeps that fraction of it (for crash and heartbeat
tests that need a trial to take a while).

Noise: a real node varies from launch to launch (clocks, placement, compiled graphs) and from
window to window. Each launch draws one factor (``launch_share`` of the variance), each level
another whose spread shrinks with the square root of its request count; together they have a
relative SD of ``noise`` at ``reference_requests``. Throughput is multiplied by the product, latencies divided by it.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import ClassVar

from backends.base import Backend
from backends.contract import Measurement, Workload
from backends.errors import UserError
from backends.launch_params import LaunchParams
from backends.session import Session

_LATENCIES = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms",
              "itl_p99_ms")
_RATES = ("output_tok_s", "output_tok_s_per_gpu", "tok_s_per_user")


@dataclass(slots=True, frozen=True)
class Simulation:
    noise: float = 0.15  # relative SD of one level measured with reference_requests
    launch_s: float = 180.0  # virtual seconds per launch
    reference_requests: int = 64
    # Share of the variance that comes from the launch (clocks, placement, compiled graphs)
    # rather than the window; repeats inside one launch do not average it away.
    launch_share: float = 0.5
    real_time: float = 0.0  # fraction of virtual time actually slept
    seed: int = 0

    def __post_init__(self) -> None:
        if self.noise < 0 or self.launch_s < 0 or not 0 <= self.real_time <= 1:
            raise UserError("noise and launch_s must be >= 0, real_time in [0, 1]")
        if not 0 <= self.launch_share <= 1:
            raise UserError("launch_share must be in [0, 1]")
        if self.reference_requests < 1:
            raise UserError("reference_requests must be >= 1")


class SimulatedBackend(Backend):
    """Wraps a noiseless backend (the performance model: the hidden truth)."""

    name: ClassVar[str] = "simulated"

    def __init__(self, truth: Backend, simulation: Simulation) -> None:
        self.truth, self.simulation = truth, simulation
        self.launches = 0  # seeds each launch's noise, so a study replays exactly

    def flags(self, launch: LaunchParams) -> list[str]:
        return self.truth.flags(launch)

    def env(self, launch: LaunchParams) -> dict[str, str]:
        return self.truth.env(launch)

    @contextlib.contextmanager
    def session(self, launch: LaunchParams, workload: Workload) -> Iterator[Session]:
        sim = self.simulation
        self.launches += 1
        rng = random.Random(f"{sim.seed}/{self.launches}")
        _sleep(sim, sim.launch_s)
        with self.truth.session(launch, workload) as truth:  # LaunchFailed passes through
            session = _NoisySession(truth, sim, workload, rng)
            session.clock.launch_s = sim.launch_s
            yield session


class _NoisySession(Session):
    def __init__(self, truth: Session, sim: Simulation, workload: Workload,
                 rng: random.Random) -> None:
        super().__init__()
        self.truth, self.sim, self.workload, self.rng = truth, sim, workload, rng
        self.launch_factor = self._factor(sim.noise * math.sqrt(sim.launch_share))

    def measure(self, concurrency: int, requests: int | None = None) -> Measurement:
        return self._level(concurrency, requests)  # virtual time only, not the wall clock

    def _level(self, concurrency: int, requests: int | None) -> Measurement:
        exact = self.truth.measure(concurrency, requests)
        if not exact.ok:
            return replace(exact, predicted=False)
        n = requests or max(2 * concurrency, 8)
        window = self.sim.noise * math.sqrt(1 - self.sim.launch_share)
        spread = window * math.sqrt(self.sim.reference_requests / n)
        noisy = _scaled(exact, self.launch_factor * self._factor(spread))
        seconds = n * self.workload.output_len / max(exact.output_tok_s, 1e-9)
        self.clock.measure_s += seconds
        _sleep(self.sim, seconds)
        return noisy

    def _factor(self, sd: float) -> float:
        # Truncated so that a wild draw cannot make a rate negative.
        return max(0.2, 1.0 + self.rng.gauss(0.0, sd))


def _scaled(m: Measurement, factor: float) -> Measurement:
    rates = {k: getattr(m, k) * factor for k in _RATES}
    latencies = {k: getattr(m, k) / factor for k in _LATENCIES if getattr(m, k) is not None}
    return replace(m, **rates, **latencies, predicted=False)


def _sleep(sim: Simulation, virtual_s: float) -> None:
    if sim.real_time > 0:
        time.sleep(virtual_s * sim.real_time)
