"""Robust statistics of noisy repeats: medians, MAD, one pooled noise estimate, and the scores
configurations are ranked by. Pure functions; every module that weighs repeats uses these.

A configuration measured once with 20% noise can look 20% better than it is. Ranking by a lower
bound, median minus a multiple of the spread's standard error, makes a lucky single run lose
to a configuration that is good every time.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable
from collections.abc import Sequence

MAD_TO_SD = 1.4826  # MAD of a normal sample times this estimates its standard deviation
MEDIAN_SE = math.sqrt(math.pi / 2)  # sd of a median of n normal samples ~ 1.2533 sd / sqrt(n)
# Fewer repeats say little about their own spread (with 2 the residuals mirror each other);
# below it a prior stands in.
MIN_REPEATS = 3


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation from the median (unscaled)."""
    centre = median(values)
    return median([abs(v - centre) for v in values])


def relative_noise(groups: Iterable[Sequence[float]], fallback: float = 0.0) -> float:
    """One relative SD of a single run: ``MAD_TO_SD`` x the median absolute residual (each
    value / its group's median - 1), residuals pooled over every group of at least
    ``MIN_REPEATS``; ``fallback`` when there is none. Pooled because the groups ran on the same
    machine, and a MAD of 5 samples alone is off by +-50%.

    Biased low for small groups (one residual of every odd group is exactly zero: ~1/2 of the
    SD with 3 repeats, ~3/4 with 5); the nightly rule's ``mad_k`` and its asserted error rates
    were set with it, so nightly keeps it. The launch-aware finals use ``pairwise_noise``."""
    residuals = [abs(v / median(g) - 1.0) for g in groups
                 if len(g) >= MIN_REPEATS and median(g) > 0 for v in g]
    return MAD_TO_SD * median(residuals) if residuals else fallback


def pairwise_noise(groups: Iterable[Sequence[float]], fallback: float = 0.0) -> float:
    """One relative SD of a single run, pooled over every group of at least ``MIN_REPEATS``
    (the groups ran on the same machine, and 3-5 runs alone say little about their spread);
    ``fallback`` when there is none.

    From the differences of log values within each group, every pair once: a difference of
    two runs has twice a run's variance whatever the group size, so the median absolute
    difference / (0.6745 x sqrt 2) reads the SD of 3 repeats as well as of 5, and one wild run
    moves only its own pairs."""
    diffs = [abs(math.log(a) - math.log(b)) for g in groups
             if len(g) >= MIN_REPEATS and all(v > 0 for v in g)
             for a, b in itertools.combinations(g, 2)]
    return MAD_TO_SD / math.sqrt(2) * median(diffs) if diffs else fallback


def spread(values: Sequence[float], prior_rel_sd: float) -> float:
    """Estimated SD of one run: from the MAD with enough runs (never below a tenth of the prior,
    three equal runs prove little), else the prior relative SD times the median."""
    prior = prior_rel_sd * abs(median(values))
    if len(values) < MIN_REPEATS:
        return prior
    return max(MAD_TO_SD * mad(values), 0.1 * prior)


def lower_bound(values: Sequence[float], penalty: float, prior_rel_sd: float) -> float:
    """median - penalty * SD / sqrt(n): the score a configuration is ranked by."""
    if not values:
        return -math.inf
    return median(values) - penalty * spread(values, prior_rel_sd) / math.sqrt(len(values))


def blended_score(runs: Sequence[float], predicted: float | None, model_rel_sd: float,
                  noise_rel_sd: float, penalty: float) -> float:
    """Posterior lower bound of a configuration's value from its runs and the calibrated
    model's prediction, each weighted by its precision (normal approximation, relative SDs).

    When the model is good (small residuals after calibration) it separates configurations
    that noisy runs cannot; when it is bad its weight vanishes and this is the runs' bound."""
    m = median(runs)
    meas_var = (max(noise_rel_sd, 1e-6) * m) ** 2 / len(runs)
    if not predicted or predicted <= 0:
        return m - penalty * math.sqrt(meas_var)
    model_var = (max(model_rel_sd, 1e-6) * predicted) ** 2
    precision = 1 / meas_var + 1 / model_var
    mean = (m / meas_var + predicted / model_var) / precision
    return mean - penalty / math.sqrt(precision)
