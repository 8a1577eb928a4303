"""The bounded global fit: one set of constants per hardware class over many sources.

Each source (a reference or validation YAML: one node, one engine) maps the shared parameter
vector to its own :class:`Efficiency` through its GPU's hardware classes (constants.fit_classes):
two PCIe sources share one collective latency, a PCIe and an NVLink source do not. The fit is
scipy's trust-region least squares inside the declared physical bounds, in log space, from
several starts (one at the priors, the rest spread over the box), keeping the best. A weak prior
pulls constants the data does not constrain back to their physical default instead of letting
them drift; which constants the data does identify is read off the Jacobian of the data
residuals alone (``Identifiability``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from backends.perf_model.catalog import load_hardware
from backends.perf_model.constants import COMPILED_FORWARD, Efficiency, bounds
from backends.perf_model.calibrate import Comparison, compare
from backends.perf_model.references import Reference, model_predictor

# us added before taking the log of a constant that may be 0 (the per-round cost), so that the
# log stays finite and 0 stays reachable.
_SHIFT = {"spec_round_us": 20.0, "spec_request_us": 2.0, "kernel_fixed_us": 0.5,
          "ep_dispatch_us": 2.0, "prefill_moe_host_us": 50.0}
PRIOR_WEIGHT = 0.05  # a prior residual of log(2) costs like a 3.5% miss on one observation
NOISE_FLOOR = 0.05  # relative error assumed of a published number, for the standard errors
WEAK_SE = 0.35  # a log standard error above this (about +-40%) is "not identified"
MISS = math.log(1e3)  # residual of an observation the constants cannot even launch


@dataclass(slots=True, frozen=True)
class Constant:
    """One fitted number: ``name`` for the hardware class ``klass`` (e.g. gddr7, nvlink)."""

    name: str
    klass: str

    @property
    def key(self) -> str:
        return f"{self.name}@{self.klass}"

    def to_x(self, value: float) -> float:
        return math.log(value + _SHIFT.get(self.name, 0.0))

    def from_x(self, x: float) -> float:
        return math.exp(x) - _SHIFT.get(self.name, 0.0)

    @property
    def bounds(self) -> tuple[float, float]:
        return bounds(self.name, self.klass)

    @property
    def x_bounds(self) -> tuple[float, float]:
        low, high = self.bounds
        return self.to_x(low), self.to_x(high)


@dataclass(slots=True)
class Identified:
    key: str
    value: float
    low: float
    high: float
    log_se: float  # standard error in log space (inf: no observation depends on it)
    at_bound: bool

    @property
    def status(self) -> str:
        if self.at_bound:
            return "AT BOUND"
        if not math.isfinite(self.log_se):
            return "not identified (no observation depends on it)"
        spread = f"+-{math.expm1(self.log_se):.0%}" if self.log_se < 3 else "+-more than 20x"
        if self.log_se > WEAK_SE:
            return f"weakly identified ({spread})"
        return f"identified ({spread})"


@dataclass(slots=True)
class FitResult:
    values: dict[str, float]  # Constant.key -> value
    identified: list[Identified]
    loss: float
    starts: int
    losses: list[float] = field(default_factory=list)  # each start's final loss

    def efficiency(self, gpu: str, engine: str = "sglang",
                   fallback: Efficiency | None = None) -> Efficiency:
        """The constants of a node with this GPU running ``engine``: its classes' fitted
        values, the fallback's (or the priors) for a class no source covered."""
        base = (fallback or prior_efficiency(gpu)).as_dict()
        classes = load_hardware(gpu).classes(engine)
        fitted = {n: self.values[f"{n}@{c}"] for n, c in classes.items()
                  if f"{n}@{c}" in self.values}
        return Efficiency(**{**base, **fitted})

    @property
    def pinned(self) -> list[str]:
        return [i.key for i in self.identified if i.at_bound]


def prior_efficiency(gpu: str) -> Efficiency:
    """Physical defaults: the dataclass's neutral values and the interconnect's own latency."""
    return Efficiency(collective_latency_us=load_hardware(gpu).collective_latency_us)


def constants_of(sources: Sequence[Reference]) -> list[Constant]:
    seen: dict[str, Constant] = {}
    for src in sources:
        for name, klass in _classes(src).items():
            if name.startswith("spec_") and not any(o.launch.speculative
                                                   for o in src.observations):
                continue
            if name == "ep_dispatch_us" and not any(o.launch.ep_size > 1
                                                   for o in src.observations):
                continue
            if name == "prefill_moe_host_us" and src.deployment.engine in COMPILED_FORWARD:
                continue
            c = Constant(name, klass)
            seen.setdefault(c.key, c)
    return sorted(seen.values(), key=lambda c: c.key)


def fit_sources(sources: Sequence[Reference], starts: int = 4, seed: int = 0,
                max_nfev: int = 200,
                progress: Callable[[int, int, float | None], None] | None = None) -> FitResult:
    """Fit every source's fitted observations at once; see the module docstring.
    ``progress(starts done, starts, best cost so far)`` is called before the first start and
    after each (a start can take many seconds)."""
    from scipy.optimize import least_squares

    consts = constants_of(sources)
    priors = _prior_x(consts, sources)
    low = np.array([c.x_bounds[0] for c in consts])
    high = np.array([c.x_bounds[1] for c in consts])
    data = _Residuals(consts, sources)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.concatenate([data(x), PRIOR_WEIGHT * (x - priors)])

    best, losses = None, []
    tell = progress or (lambda done, total, cost: None)
    tell(0, starts, None)
    for x0 in _starts(priors, low, high, starts, seed):
        res = least_squares(residuals, x0, bounds=(low, high), method="trf",
                            diff_step=1e-3, max_nfev=max_nfev)
        losses.append(float(res.cost))
        if best is None or res.cost < best.cost:
            best = res
        tell(len(losses), starts, float(best.cost))
    values = {c.key: c.from_x(x) for c, x in zip(consts, best.x)}
    return FitResult(values, _identify(consts, best.x, data, low, high), float(best.cost),
                     starts, losses)


class _Residuals:
    """log(predicted / observed) of every fitted observation, for a parameter vector."""

    def __init__(self, consts: Sequence[Constant], sources: Sequence[Reference]) -> None:
        self.consts = consts
        self.sources = [(src, model_predictor(src.deployment), prior_efficiency(src.deployment.gpu),
                         _classes(src)) for src in sources]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        values = {c.key: c.from_x(v) for c, v in zip(self.consts, x)}
        out = []
        for src, predict, prior, classes in self.sources:
            eff = Efficiency(**{**prior.as_dict(), **{
                n: values[f"{n}@{k}"] for n, k in classes.items() if f"{n}@{k}" in values}})
            for obs in src.observations:
                if obs.fitted:
                    got = predict(eff, obs, src.workload)
                    out.append(math.log(got / obs.value) if got > 0 else MISS)
        return np.array(out)


def _classes(src: Reference) -> dict[str, str]:
    return load_hardware(src.deployment.gpu).classes(src.deployment.engine)


def _prior_x(consts: Sequence[Constant], sources: Sequence[Reference]) -> np.ndarray:
    priors = {}
    for src in sources:
        prior = prior_efficiency(src.deployment.gpu).as_dict()
        for name, klass in _classes(src).items():
            priors.setdefault(f"{name}@{klass}", prior[name])
    return np.array([c.to_x(min(max(priors[c.key], c.bounds[0]), c.bounds[1])) for c in consts])


def _starts(priors: np.ndarray, low: np.ndarray, high: np.ndarray, n: int,
            seed: int) -> list[np.ndarray]:
    """The priors, then points spread over the box (deterministic for a seed)."""
    rng = random.Random(seed)
    out = [np.clip(priors, low, high)]
    for _ in range(max(0, n - 1)):
        out.append(np.array([lo + (hi - lo) * (0.1 + 0.8 * rng.random())
                             for lo, hi in zip(low, high)]))
    return out


def _identify(consts: Sequence[Constant], x: np.ndarray, data: _Residuals, low: np.ndarray,
              high: np.ndarray) -> list[Identified]:
    """Standard errors from the data Jacobian (J^T J)^-1 scaled by the residual variance (at
    least NOISE_FLOOR), and which constants sit on a bound."""
    r0 = data(x)
    step = 1e-3
    jac = np.empty((len(r0), len(x)))
    for j in range(len(x)):
        xj = x.copy()
        xj[j] += step if x[j] + step <= high[j] else -step
        jac[:, j] = (data(xj) - r0) / (xj[j] - x[j])
    dof = max(1, len(r0) - len(x))
    sigma2 = max(float(r0 @ r0) / dof, NOISE_FLOOR ** 2)
    info = jac.T @ jac
    cov = np.linalg.pinv(info, rcond=1e-10) * sigma2
    out = []
    for j, c in enumerate(consts):
        no_effect = float(np.abs(jac[:, j]).max()) < 1e-6
        se = math.inf if no_effect else math.sqrt(max(cov[j, j], 0.0))
        width = high[j] - low[j]
        at_bound = not no_effect and min(x[j] - low[j], high[j] - x[j]) < 1e-3 * width
        lo, hi = c.bounds
        out.append(Identified(c.key, c.from_x(x[j]), lo, hi, se, at_bound))
    return out


def fit_reference(ref: Reference) -> tuple[Efficiency, list[Comparison]]:
    """Constants fitted to ``ref`` alone and how each observation compares under them."""
    eff = fit_sources([ref]).efficiency(ref.deployment.gpu, ref.deployment.engine)
    return eff, compare(model_predictor(ref.deployment), eff, ref.observations, ref.workload)
