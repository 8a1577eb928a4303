"""Observations of a node and the fit of the efficiency constants to them.

An observation is one published or measured number of one configuration: output tok/s at a
level (or the best over the workload's levels, ``peak``), a load test's peak one-second output
(``peak_output_tok_s``), a speedup over a baseline configuration, or a latency. The fit
minimises the squared log error of the fitted metrics: throughput, speedups and median TTFTs
(a TTFT times one prompt's prefill, which no throughput isolates); a TPOT is the decode side of
a throughput already fitted, so it is compared, not fitted, and so is any observation that says
why it is compared (``Observation.compared``). Two fits share this module:
``fit`` (one node, a coordinate search the launch-aware screen runs every round) and the
bounded global fit of ``backends.perf_model.global_fit`` over many nodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backends.contract import Workload
from backends.launch_params import LaunchParams
from backends.perf_model.constants import Efficiency, bounds

PEAK = "peak"
SPEEDUP = "speedup"
# The "Peak output token throughput" line of sglang.bench_serving and vllm bench serve: the most
# output tokens any one second of the run held. A saturated closed loop reaches it in a second in
# which no prompt is prefilled, so it is the running batch's decode rate, not the run's average.
PEAK_SECOND = "peak_output_tok_s"
THROUGHPUT_METRICS = ("output_tok_s", PEAK_SECOND, SPEEDUP)
TTFT = "ttft_p50_ms"
FITTED_METRICS = (*THROUGHPUT_METRICS, TTFT)
METRICS = (*FITTED_METRICS, "tpot_p50_ms")


@dataclass(slots=True, frozen=True)
class Observation:
    name: str
    launch: LaunchParams
    at: int | str  # a concurrency level, or "peak" (best over the workload's levels)
    value: float  # of ``metric``
    metric: str = "output_tok_s"
    baseline: LaunchParams | None = None  # a speedup's denominator, at the same level
    # Why this observation is compared but not fitted (empty: its metric decides), e.g. a
    # saturated run's TTFT, which times the benchmark's queue rather than a prefill.
    compared: str = ""

    @property
    def fitted(self) -> bool:
        return self.metric in FITTED_METRICS and not self.compared


@dataclass(slots=True, frozen=True)
class Comparison:
    name: str
    observed: float
    predicted: float
    metric: str = "output_tok_s"
    compared: bool = False  # the observation said why it is compared only

    @property
    def ratio(self) -> float:
        return self.predicted / self.observed if self.observed else math.inf

    @property
    def fitted(self) -> bool:
        return self.metric in FITTED_METRICS and not self.compared


# Builds a backend for some constants and returns the predicted metric for one observation.
Predictor = Callable[[Efficiency, Observation, Workload], float]


def compare(predict: Predictor, eff: Efficiency, observations: Sequence[Observation],
            workload: Workload) -> list[Comparison]:
    return [Comparison(o.name, o.value, predict(eff, o, workload), o.metric, bool(o.compared))
            for o in observations]


def fit(predict: Predictor, observations: Sequence[Observation], workload: Workload,
        start: Efficiency, rounds: int = 60,
        names: Sequence[str] = ("bandwidth_efficiency", "collective_latency_us",
                                "launch_overhead_us", "matmul_fixed_us"),
        classes: dict[str, str] | None = None) -> Efficiency:
    """Coordinate search over ``names`` inside their bounds (those of the node's hardware
    ``classes``, e.g. a CPU host's): try scaling each constant up/down, keep improvements, then
    refine. Cheap and deterministic; a local search (the global fit is the one to trust for
    shipped constants)."""
    classes = classes or {}
    observations = [o for o in observations if o.fitted]
    best, best_loss = start, _loss(compare(predict, start, observations, workload))
    step = 2.0
    for _ in range(rounds):
        improved = False
        for name in names:
            for factor in (step, 1.0 / step):
                candidate = _scaled(best, name, factor, classes.get(name, ""))
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


def _scaled(eff: Efficiency, name: str, factor: float, klass: str) -> Efficiency | None:
    value = getattr(eff, name) * factor
    low, high = bounds(name, klass)
    if not low <= value <= high:
        return None
    return eff.with_values(**{name: value})


def _loss(rows: Sequence[Comparison]) -> float:
    return sum(math.log(max(r.ratio, 1e-9)) ** 2 for r in rows if r.fitted)
