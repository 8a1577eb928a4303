"""Fit the four efficiency constants to measured throughput.

Observations come from a reference file (the user's numbers) or from measurements stored by real
backends. The fit minimises the squared log error of predicted vs observed output tok/s by
coordinate search in log space: deterministic, dependency-free, and fast for a handful of
constants.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backends.contract import Workload
from backends.launch_params import LaunchParams
from backends.perf_model.constants import Efficiency

PEAK = "peak"


@dataclass(slots=True, frozen=True)
class Observation:
    name: str
    launch: LaunchParams
    at: int | str  # a concurrency level, or "peak" (best over the workload's levels)
    output_tok_s: float


@dataclass(slots=True, frozen=True)
class Comparison:
    name: str
    observed: float
    predicted: float

    @property
    def ratio(self) -> float:
        return self.predicted / self.observed if self.observed else math.inf


# Builds a backend for some constants and returns predicted tok/s for one observation.
Predictor = Callable[[Efficiency, Observation, Workload], float]


def compare(predict: Predictor, eff: Efficiency, observations: Sequence[Observation],
            workload: Workload) -> list[Comparison]:
    return [Comparison(o.name, o.output_tok_s, predict(eff, o, workload)) for o in observations]


def fit(predict: Predictor, observations: Sequence[Observation], workload: Workload,
        start: Efficiency, rounds: int = 60) -> Efficiency:
    """Coordinate search: try scaling each constant up/down, keep improvements, then refine."""
    best, best_loss = start, _loss(compare(predict, start, observations, workload))
    step = 2.0
    for _ in range(rounds):
        improved = False
        for name in Efficiency.names():
            for factor in (step, 1.0 / step):
                candidate = _scaled(best, name, factor)
                if candidate is None:
                    continue
                loss = _loss(compare(predict, candidate, observations, workload))
                if loss < best_loss - 1e-12:
                    best, best_loss, improved = candidate, loss, True
        if not improved:
            step = math.sqrt(step)
            if step < 1.001:
                break
    return best


def _scaled(eff: Efficiency, name: str, factor: float) -> Efficiency | None:
    value = getattr(eff, name) * factor
    if name == "bandwidth_efficiency" and value > 1.0:
        return None
    return eff.with_values(**{name: value})


def _loss(rows: Sequence[Comparison]) -> float:
    return sum(math.log(max(r.ratio, 1e-9)) ** 2 for r in rows)
