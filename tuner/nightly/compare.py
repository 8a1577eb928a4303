"""The noise-aware regression rule. Pure functions over repeat values: no I/O, no clock.

Today a configuration is measured ``n`` times (each repeat a fresh launch); ``m`` is the median.
Its reference is the median of the per-run medians of up to ``history`` earlier nightly runs of
the same configuration (``N`` repeats behind them in all), or, before there are any, the number
the study recorded for it, taken as exact (``N`` = infinity).

The noise is one relative standard deviation, ``sigma = 1.4826 x MAD`` of today's relative
residuals (each value / its configuration's median - 1) pooled over every configuration measured
today with at least 3 repeats (:func:`tuner.stats.relative_noise`). Pooled because the
incumbent and the baseline ran on the same machine within the same hour, and a MAD of 5 samples
alone is off by +-50%.

A change is beyond noise when

    |m - reference| / reference  >  max(threshold, k x 1.2533 x sigma x sqrt(1/n + 1/N))

and a regression when it is beyond noise and slower. ``1.2533 x sigma / sqrt(n)`` is the
standard error of the median of ``n`` normal samples, so the right-hand term is ``k`` standard
errors of the difference between two medians. Not ``k x 1.4826 x MAD`` (the spread of a single
sample): a median of 5 is about twice as steady as one run, and asking a drop to clear three
single-run sigmas lets a 10% slowdown under 3% noise through one night in five. The threshold
is a floor so that a change that is certain but small (a deterministic backend has no noise) does
not fail the job. Numbers for the default settings are in docs/NIGHTLY.md.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.stats import MEDIAN_SE
from tuner.stats import median
from tuner.stats import relative_noise


@dataclass(slots=True, frozen=True)
class Reference:
    median: float
    repeats: int | None  # None: exact, i.e. the study's own record
    source: str  # for people: "study trial 7", "3 nightly runs", "the incumbent today"


@dataclass(slots=True, frozen=True)
class Verdict:
    today: float
    reference: Reference
    change: float  # relative to the reference; negative = slower
    tolerance: float  # relative; a change beyond it is not noise

    @property
    def beyond_noise(self) -> bool:
        return abs(self.change) > self.tolerance

    @property
    def regressed(self) -> bool:
        return self.beyond_noise and self.change < 0

    @property
    def improved(self) -> bool:
        return self.beyond_noise and self.change > 0


def reference_from_runs(runs: Sequence[tuple[float, int]], source: str) -> Reference | None:
    """The reference of earlier runs given as (median, repeats); None when there are none."""
    if not runs:
        return None
    return Reference(median([m for m, _ in runs]), sum(n for _, n in runs), source)


def tolerance(noise: float, repeats: int, reference: Reference, threshold: float,
              k: float) -> float:
    """The relative change that is not noise (see the module docstring)."""
    inverse = 1.0 / repeats + (1.0 / reference.repeats if reference.repeats else 0.0)
    return max(threshold, k * MEDIAN_SE * noise * math.sqrt(inverse))


def judge(values: Sequence[float], reference: Reference, noise: float, threshold: float,
          k: float) -> Verdict:
    """Today's repeats of one configuration against its reference."""
    today = median(values)
    change = today / reference.median - 1.0 if reference.median > 0 else 0.0
    return Verdict(today, reference, change,
                   tolerance(noise, len(values), reference, threshold, k))


def beats(challenger: Sequence[float], incumbent: Sequence[float], noise: float,
          threshold: float, k: float) -> Verdict:
    """The challenger against the incumbent, both measured today; ``.improved`` = it wins."""
    reference = Reference(median(incumbent), len(incumbent), "the incumbent today")
    return judge(challenger, reference, noise, threshold, k)


def flag_rate(drop: float, history_runs: int, nights: int = 3000, noise: float = 0.03,
              repeats: int = 5, threshold: float = 0.05, k: float = 3.0, seed: int = 1) -> float:
    """How often the rule flags a true relative ``drop`` (simulated, seeded): each night the
    incumbent and the baseline get ``repeats`` values with Gaussian ``noise``, judged against the
    study's exact number (``history_runs`` = 0) or the median of that many earlier noisy runs.
    What `bench/nightly_rule_bench.py` tabulates and the tests bound."""
    rng = random.Random(seed)

    def run(level: float) -> list[float]:
        return [level * (1 + rng.gauss(0, noise)) for _ in range(repeats)]

    flags = 0
    for _ in range(nights):
        today, baseline = run(1 - drop), run(1.0)
        earlier = [(median(run(1.0)), repeats) for _ in range(history_runs)]
        reference = reference_from_runs(earlier, "runs") or Reference(1.0, None, "study")
        flags += judge(today, reference, relative_noise([today, baseline]), threshold, k).regressed
    return flags / nights
