"""Robust statistics for noisy repeats: medians, MAD, and the score finalists are ranked by.

A configuration measured once with 20% noise can look 20% better than it is. Ranking by a lower
bound, median minus a multiple of the spread's standard error, makes a lucky single run lose
to a configuration that is good every time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

# MAD times this estimates the standard deviation of normally distributed values.
MAD_TO_SD = 1.4826
# Fewer runs than this say too little about their own spread; the prior stands in.
MIN_RUNS_FOR_SPREAD = 3


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation from the median."""
    centre = median(values)
    return median([abs(v - centre) for v in values])


def spread(values: Sequence[float], prior_rel_sd: float) -> float:
    """Estimated SD of one run: from the MAD with enough runs (never below a tenth of the prior,
    three equal runs prove little), else the prior relative SD times the median."""
    centre = median(values)
    prior = prior_rel_sd * abs(centre)
    if len(values) < MIN_RUNS_FOR_SPREAD:
        return prior
    return max(MAD_TO_SD * mad(values), 0.1 * prior)


def lower_bound(values: Sequence[float], penalty: float, prior_rel_sd: float) -> float:
    """median - penalty * SD / sqrt(n): the score a configuration is ranked by."""
    if not values:
        return -math.inf
    return median(values) - penalty * spread(values, prior_rel_sd) / math.sqrt(len(values))


def relative_spread(groups: Sequence[Sequence[float]], prior_rel_sd: float) -> float:
    """Relative SD of one run, pooled over configurations measured at least twice (the prior
    until some were)."""
    rel = [MAD_TO_SD * mad(g) / median(g) for g in groups if len(g) >= 2 and median(g) > 0]
    return median(rel) if len(rel) >= 2 else prior_rel_sd


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
