"""The simulated node: the model's numbers with the configured noise, and launch cost in its
clock; one launch measured level by level."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from backends.contract import LaunchFailed
from backends.launch_params import LaunchParams
from tuner.config import load_config
from tuner.launches.sla_search import search_limit
from tuner.sla import Limit
from tuner.wiring import backend_from, workload_from

DFLASH = LaunchParams(tp_size=8, dp_size=1, ep_size=8, speculative_algorithm="dflash",
                      speculative_dflash_block_size=6)


def _backend(noise: float = 0.15, **sim):
    cfg = load_config(None, {"backend.name": "simulated",
                             "backend.simulation": {"noise": noise, "launch_s": 120.0, **sim}})
    return backend_from(cfg), workload_from(cfg)


def test_noise_has_the_configured_spread_around_the_truth():
    backend, workload = _backend()
    exact = backend.truth.measure(DFLASH, workload)[-1].output_tok_s
    values = []
    for _ in range(300):
        with backend.session(DFLASH, workload) as session:
            values.append(session.measure(256, 64).output_tok_s)
    assert statistics.median(values) == pytest.approx(exact, rel=0.03)
    assert statistics.pstdev(values) / exact == pytest.approx(0.15, rel=0.2)


def test_a_launch_costs_its_launch_time_and_levels_their_duration():
    backend, workload = _backend(noise=0.0)
    with backend.session(DFLASH, workload) as session:
        m = session.measure(16, 32)
    assert session.clock.launch_s == 120.0
    assert session.clock.measure_s == pytest.approx(32 * workload.output_len / m.output_tok_s)


def test_what_cannot_launch_raises_launch_failed():
    backend, workload = _backend()
    with pytest.raises(LaunchFailed) as failed:
        with backend.session(replace(DFLASH, tp_size=2, ep_size=1), workload):
            pass
    assert failed.value.failure.value in ("invalid_config", "oom")


@pytest.mark.parametrize("tpot", [30.0, 50.0, 80.0])
def test_the_sla_search_finds_the_limit_an_exhaustive_scan_finds(tpot):
    backend, workload = _backend(noise=0.0)
    limits = [Limit("tpot_p50_ms", "<=", tpot)]
    with backend.session(DFLASH, workload) as session:
        found = search_limit(session.measure, limits, 256, guess=8, refinements=4)
        scan = [session.measure(c) for c in range(1, 257)]
    best = max((m for m in scan if m.tpot_p50_ms <= tpot), key=lambda m: m.output_tok_s)
    assert found.best is not None
    assert found.best.output_tok_s >= 0.93 * best.output_tok_s
    assert len(found.points) <= 14  # a handful of levels, not a sweep


def test_a_limit_even_concurrency_1_misses_gives_no_best():
    backend, workload = _backend(noise=0.0)
    with backend.session(DFLASH, workload) as session:
        found = search_limit(session.measure, [Limit("tpot_p50_ms", "<=", 0.01)], 256)
    assert found.best is None and [m.concurrency for m in found.points] == [1]


def test_launch_share_splits_the_noise_between_launch_and_window():
    backend, workload = _backend(launch_share=1.0)  # all of it per launch
    exact = backend.truth.measure(DFLASH, workload)[-1].output_tok_s
    factors = []
    for _ in range(50):
        with backend.session(DFLASH, workload) as session:
            a, b = (session.measure(256, n).output_tok_s for n in (8, 512))
        assert a == pytest.approx(b)  # one factor for the whole launch, whatever the window
        factors.append(a / exact)
    assert statistics.pstdev(factors) == pytest.approx(0.15, rel=0.3)
