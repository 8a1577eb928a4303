"""The cheap fidelity: the performance model proposes what is worth a launch.

Before anything is launched the model's constants are the configured ones (fitted on some other
node); after every round they are refitted to what the launches measured, so the model's
ranking follows the node at hand. Each refit starts from the configured constants, so a fit is
a function of the launches alone: workers sharing a study rank alike. A proposal is the model's
best configurations, found by random sampling and then a walk through single-parameter
neighbourhoods, with what was already launched left out.

The knobs the model prices at their defaults (NCCL's protocol, ...) cannot rank anything: of the
configurations that differ only in them the screen proposes one, at the engine's defaults where
the space's rules allow, and `variants` lists the values a measurement must tell apart.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from backends.contract import LaunchFailed, Measurement, Workload
from backends.deployment import Deployment
from backends.launch_params import LaunchParams
from backends.perf_model import Efficiency, PerfModelBackend
from backends.perf_model.acceptance_fit import fit_acceptance
from backends.perf_model.backend import unpriced_knobs
from backends.perf_model.calibrate import Observation, fit
from backends.perf_model.catalog import load_hardware
from backends.perf_model.references import model_predictor
from search_spaces import SearchSpace
from tuner.params import parse
from tuner.selection import config_key
from tuner.sla import Limit, meets

# Configurations whose neighbourhoods are walked after random sampling.
WALK_STARTS = 4
WALK_SWEEPS = 4


@dataclass(slots=True, frozen=True)
class Prediction:
    params: dict
    goodput: float  # predicted output tok/s at the SLA limit
    limit: int  # predicted highest concurrency meeting the SLA


@dataclass
class Screen:
    deployment: Deployment
    space: SearchSpace
    context: dict
    workload: Workload
    limits: Sequence[Limit]
    max_concurrency: int
    efficiency: Efficiency
    samples: int = 1500
    seed: int = 0

    def __post_init__(self) -> None:
        self.model = PerfModelBackend(self.deployment, self.efficiency)
        self._memo: dict[str, Prediction | None] = {}
        self._configured = (self.deployment, self.efficiency)
        unpriced = unpriced_knobs(self.deployment.measured_kernels)
        self.unpriced = {f.name: f.default for f in fields(LaunchParams) if f.name in unpriced}

    def priced_key(self, params: dict) -> str:
        """What the model can tell apart: ``params`` less the knobs it prices at defaults."""
        return config_key({k: v for k, v in params.items() if k not in self.unpriced})

    def variants(self, params: dict, knob: str) -> list[dict]:
        """``params`` with ``knob`` (one the model cannot price) at each other value the space
        allows there, everything else as it is."""
        key, rng = self.priced_key(params), random.Random(0)
        return [n for n in self.space.neighbours(params, self.context, rng)
                if n.get(knob) != params.get(knob) and self.priced_key(n) == key]

    def calibrate(self, measured: Sequence[tuple[dict, Measurement]]) -> None:
        """Refit the drafter's acceptance to the measured tokens per round, then the model's
        efficiency constants to the measured throughput (successful (params, level) pairs),
        both from the configured values."""
        measured = [(launch, m) for params, m in measured
                    if (launch := parse(params)[0]) is not None]
        self.deployment, self.efficiency = self._configured
        self.deployment = fit_acceptance(
            self.deployment, self.efficiency, self.workload,
            [(launch, m.accept_len_mean) for launch, m in measured if m.ok])
        observations = [Observation(f"m{i}", launch, m.concurrency, m.output_tok_s)
                        for i, (launch, m) in enumerate(measured) if m.ok and m.output_tok_s > 0]
        if observations:
            self.efficiency = self._fit_efficiency(observations)
        self.model = PerfModelBackend(self.deployment, self.efficiency)
        self._memo.clear()

    def _fit_efficiency(self, observations: list[Observation]) -> Efficiency:
        by_level = model_predictor(self.deployment)

        def predict(eff: Efficiency, obs: Observation, workload: Workload) -> float:
            return by_level(eff, obs, replace(workload, concurrency=(obs.at,)))

        classes = load_hardware(self.deployment.gpu).classes(self.deployment.engine)
        return fit(predict, observations, self.workload, self.efficiency, rounds=20,
                   classes=classes)

    def predict(self, params: dict) -> Prediction | None:
        """The model's SLA limit and throughput there; None if nothing meets the SLA."""
        key = config_key(params)
        if key not in self._memo:
            self._memo[key] = self._predict(params)
        return self._memo[key]

    def propose(self, k: int, exclude: set[str], must: dict | None = None) -> list[Prediction]:
        """The ``k`` best predicted configurations whose ``priced_key`` is not in ``exclude``;
        ``must`` fixes some parameters (e.g. the no-speculation baseline)."""
        rng = random.Random(f"{self.seed}/{len(exclude)}")
        pool: dict[str, dict] = {}
        for _ in range(self.samples):
            if (params := self._sample(rng, must)) is not None:
                self._keep(pool, params)
        ranked = self._ranked(pool.values())
        for start in ranked[:WALK_STARTS]:
            for p in self.walk(start, rng, must):
                self._keep(pool, p.params)
        fresh = [p for p in self._ranked(pool.values())
                 if self.priced_key(p.params) not in exclude]
        return fresh[:k]

    def _sample(self, rng: random.Random, must: dict | None) -> dict | None:
        """A feasible sample with the unpriced knobs at their defaults, else at whatever values
        the space's rules leave; None if the draw breaks a rule either way."""
        for given in ({**self.unpriced, **(must or {})}, must):
            params = self.space.sample(self.context, rng, given)
            if not self.space.violations(params, self.context):
                return params
        return None

    def _keep(self, pool: dict[str, dict], params: dict) -> None:
        """One configuration per priced key: the one with the fewest unpriced knobs away from
        their defaults."""
        key = self.priced_key(params)
        if key not in pool or self._off_default(params) < self._off_default(pool[key]):
            pool[key] = params

    def _off_default(self, params: dict) -> int:
        return sum(k in params and params[k] != d for k, d in self.unpriced.items())

    def _ranked(self, configs) -> list[Prediction]:
        found = [p for p in map(self.predict, configs) if p is not None]
        return sorted(found, key=lambda p: -p.goodput)

    def walk(self, start: Prediction, rng: random.Random, must: dict | None = None,
             sweeps: int = WALK_SWEEPS) -> list[Prediction]:
        """Best-improvement steps through single-parameter changes, from ``start``."""
        path = [start]
        for _ in range(sweeps):
            nbrs = [n for n in self.space.neighbours(path[-1].params, self.context, rng)
                    if not must or all(n.get(k) == v for k, v in must.items())]
            best = next(iter(self._ranked(nbrs)), None)
            if best is None or best.goodput <= path[-1].goodput:
                break
            path.append(best)
        return path

    def _predict(self, params: dict) -> Prediction | None:
        launch, _ = parse(params)  # the screen samples configurations of its own
        if launch is None:
            return None
        try:
            with self.model.session(launch, self.workload) as session:
                return _limit(session.measure, self.limits, self.max_concurrency, params)
        except LaunchFailed:
            return None


def _limit(measure, limits: Sequence[Limit], top: int, params: dict) -> Prediction | None:
    """Binary search for the highest level meeting the SLA (model latencies grow with load)."""
    if not meets(measure(1), limits):
        return None
    lo, hi = 1, top + 1  # lo meets, hi does not (or is past the top)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if meets(measure(mid), limits) else (lo, mid)
    return Prediction(params, measure(lo).output_tok_s, lo)
