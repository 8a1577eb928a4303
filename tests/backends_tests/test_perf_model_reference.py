"""The calibrated model reproduces the user's measurements on 8x RTX PRO 6000 (PCIe, Kimi K2.6).

Fits the four efficiency constants once for the module (~1.5 s), then checks every observation
within 25% and every conclusion the user drew from them (REFERENCE_NUMBERS.md).
"""

from __future__ import annotations

import math

import pytest

from backends.perf_model.calibrate import compare
from backends.perf_model.constants import Efficiency
from backends.perf_model.global_fit import fit_reference
from backends.perf_model.references import load_reference
from backends.perf_model.references import model_predictor

REFERENCE = "pcie8_kimi_sglang"
OBSERVATIONS = [o.name for o in load_reference(REFERENCE).observations]


@pytest.fixture(scope="module")
def fitted(pcie8_reference):
    eff, comparisons = fit_reference(pcie8_reference)
    return eff, {c.name: c for c in comparisons}


@pytest.fixture(scope="module")
def predicted(fitted):
    return {name: c.predicted for name, c in fitted[1].items()}


@pytest.mark.parametrize("name", OBSERVATIONS)
def test_observation_is_reproduced_within_25_percent(fitted, name):
    c = fitted[1][name]
    assert 0.75 <= c.ratio <= 1.25, f"{name}: observed {c.observed}, predicted {c.predicted:.1f}"


def test_cuda_graphs_are_3_to_4x_at_concurrency_1_on_tp8(predicted):
    assert 3.0 <= predicted["TP8 graphs c1"] / predicted["TP8 eager c1"] <= 4.0


def test_dflash_beats_plain_ep8_at_concurrency_1(predicted):
    assert predicted["EP8 DFlash eager c1"] > predicted["EP8 graphs c1"]


def test_dflash_loses_to_plain_ep8_at_peak(predicted):
    assert predicted["EP8 DFlash eager peak"] < predicted["EP8 graphs peak"]


@pytest.mark.parametrize("ep", ["EP8", "EP4"])
def test_expert_parallelism_beats_tp8_at_peak(predicted, ep):
    assert predicted[f"{ep} graphs peak"] > predicted["TP8 graphs peak"]


def test_fitted_constants_are_physically_plausible(fitted):
    eff = fitted[0]
    assert 0.3 < eff.bandwidth_efficiency <= 1.0
    assert 5 <= eff.collective_latency_us <= 200
    assert 5 <= eff.launch_overhead_us <= 100
    assert 0 < eff.matmul_fixed_us <= 20


def test_fit_improves_on_the_starting_constants(pcie8_reference, fitted):
    # The fit minimises the squared log error over the observations (not the worst one).
    ref = pcie8_reference
    rows = compare(model_predictor(ref.deployment), Efficiency(), ref.observations, ref.workload)
    before = sum(math.log(r.ratio) ** 2 for r in rows)
    after = sum(math.log(c.ratio) ** 2 for c in fitted[1].values())
    assert after < before
