"""The statistics rankings and verdicts are built on: one spread, one pooled noise, one bound."""

from __future__ import annotations

import random

import pytest

from tuner import stats


def test_lower_bound_and_blend():
    assert stats.mad([1.0, 2.0, 10.0]) == 1.0
    steady, lucky = [100.0, 101.0, 99.0], [140.0]
    # One run carries the whole prior spread (20% of 140); three close runs almost none.
    assert stats.lower_bound(lucky, 1.0, 0.2) == pytest.approx(140.0 - 0.2 * 140.0)
    assert stats.lower_bound(steady, 1.0, 0.2) == pytest.approx(100.0 - 2.0 / 3 ** 0.5)
    assert stats.lower_bound(steady, 2.0, 0.2) > stats.lower_bound(lucky, 2.0, 0.2)
    # A model with a tiny error dominates noisy runs; a useless one leaves the runs' bound.
    assert stats.blended_score([120.0], 100.0, 0.001, 0.2, 0.0) == pytest.approx(100.0, 0.01)
    assert stats.blended_score([120.0], 100.0, 100.0, 0.2, 0.0) == pytest.approx(120.0, 0.01)


def test_noise_is_pooled_over_configurations_with_three_or_more_repeats():
    assert stats.relative_noise([[1.0, 2.0]]) == 0.0
    assert stats.relative_noise([[99.0, 100.0, 101.0], [198.0, 200.0, 202.0]]) == pytest.approx(
        0.014826, rel=1e-3)


def test_noise_falls_back_to_the_callers_prior_until_a_configuration_has_three_runs():
    assert stats.relative_noise([[100.0], [90.0, 110.0]], fallback=0.15) == 0.15
    assert stats.relative_noise([[90.0, 100.0, 110.0]], fallback=0.15) == pytest.approx(0.14826)


def test_pairwise_noise_is_one_relative_sd_over_configurations_at_any_level():
    assert stats.pairwise_noise([[1.0, 2.0]]) == 0.0
    # Two configurations with the same relative spread, at different levels: one relative SD.
    one = stats.pairwise_noise([[99.0, 100.0, 101.0]])
    assert stats.pairwise_noise([[99.0, 100.0, 101.0], [198.0, 200.0, 202.0]]) == pytest.approx(one)
    assert one == pytest.approx(0.01, rel=0.1)  # 99, 100, 101: a relative SD of 1%


@pytest.mark.parametrize("repeats", [3, 5])
def test_pooled_noise_reads_the_true_spread_of_few_repeats(repeats):
    # Finals repeat 3 times (5 with tuning.repeats: 5): the estimate must not shrink with the group
    # size (a pooled median of residuals from each group's median read ~0.05 here for 3).
    rng = random.Random(repeats)
    groups = [[1000.0 * (1 + rng.gauss(0.0, 0.1)) for _ in range(repeats)] for _ in range(2000)]
    assert stats.pairwise_noise(groups) == pytest.approx(0.1, rel=0.05)


def test_pairwise_noise_falls_back_to_the_prior_below_three_runs():
    assert stats.pairwise_noise([[100.0], [90.0, 110.0]], fallback=0.15) == 0.15
    assert stats.pairwise_noise([[90.0, 100.0, 110.0]], fallback=0.15) == pytest.approx(0.1, rel=0.15)


def test_one_wild_run_does_not_make_every_configuration_look_noisy():
    # A launch that measured 1/20 of its usual throughput among 10%-noise groups of 3.
    rng = random.Random(1)
    groups = [[1000.0 * (1 + rng.gauss(0.0, 0.1)) for _ in range(3)] for _ in range(8)]
    assert stats.pairwise_noise(groups + [[1600.0, 1590.0, 1630.0, 79.0]]) < 0.2
