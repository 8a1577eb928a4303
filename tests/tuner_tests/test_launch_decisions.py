"""The launch-aware strategy's decisions when other workers' launches are in flight: nobody
idles while the baseline runs, and the leader is gated while other finalists' runs are still
going, but never while its own run or another gated launch is. The decisions are made by the
real strategy on the real screen; the study's launches are written down, so each case is exact."""

from __future__ import annotations

import pytest
from cli_helpers import write_config

from backends import Measurement
from tuner.config import load_config
from tuner.launches.launcher import Launch
from tuner.launches.run import build
from tuner.launches.strategy import WAIT
from tuner.launches.strategy import Claimed
from tuner.launches.strategy import Plan

SIM = {"name": "simulated", "simulation": {"noise": 0.15, "launch_s": 180.0, "seed": 3}}
# Two finalists with two runs each: the leader's second run is its gated one.
TUNING = {"strategy": "launch_aware", "launches": 24, "per_round": 2, "finalists": 2,
          "repeats": 2, "screen_samples": 60, "gates": {"soak_s": 0.0}}


@pytest.fixture
def strategy(tmp_path):
    cfg = load_config(write_config(tmp_path, backend=SIM, tuning=TUNING))
    return build(cfg).strategy


def launched(params: dict, tok_s: float, reference: bool = False) -> Launch:
    """A launch that found ``tok_s`` at concurrency 16, well within the SLA."""
    point = Measurement(16, output_tok_s=tok_s, tok_s_per_user=tok_s / 16, tpot_p50_ms=20.0,
                        ttft_p50_ms=200.0, ttft_p99_ms=400.0, accept_len_mean=3.0)
    return Launch(params, [point], point, tok_s / 16, reference=reference)


def test_other_workers_explore_while_the_baseline_runs(strategy):
    base = strategy.next_launch([], [])
    assert isinstance(base, Plan) and base.reference
    assert base.params["speculative_algorithm"] == "none"
    flying = [Claimed(base.params, reference=True)]
    second = strategy.next_launch([], flying)
    assert isinstance(second, Plan) and not second.reference and not second.gated
    third = strategy.next_launch([], [*flying, Claimed(second.params)])
    assert isinstance(third, Plan) and third.params != second.params
    # A dead baseline (gone from the launches in flight, never recorded) is planned again.
    again = strategy.next_launch([], [Claimed(second.params), Claimed(third.params)])
    assert isinstance(again, Plan) and again.reference


def _finals(strategy) -> tuple[list[Launch], dict, dict]:
    """A study at its finals: the leader has run once (its next run is its gated one), the
    second finalist owes a run, and two launches are left."""
    base = strategy.screen.propose(1, set(), must={"speculative_algorithm": "none"})[0].params
    leader, second, *others = (p.params for p in strategy.screen.propose(4, set()))
    done = ([launched(base, 400.0, reference=True), launched(leader, 3000.0),
             launched(second, 1500.0)] + [launched(p, 500.0) for p in others])
    strategy.tuning = strategy.tuning.model_copy(update={"launches": len(done) + 2})
    return done, leader, second


def test_the_leader_is_gated_while_another_finalists_run_is_in_flight(strategy):
    done, leader, second = _finals(strategy)
    owed = strategy.next_launch(done, [])
    assert isinstance(owed, Plan) and owed.params == second and not owed.gated
    gated = strategy.next_launch(done, [Claimed(second)])
    assert isinstance(gated, Plan) and gated.gated and gated.params == leader


def test_no_gate_while_the_leaders_own_run_or_another_gate_is_in_flight(strategy):
    done, leader, second = _finals(strategy)
    assert strategy.next_launch(done, [Claimed(leader)]) == WAIT
    assert strategy.next_launch(done, [Claimed(leader, gated=True)]) == WAIT


def test_a_refit_depends_on_the_launches_alone(tmp_path):
    """Two workers refit at different moments (one after every launch, one only now) and still
    hold the same model, so they rank the study's launches alike."""
    cfg = load_config(write_config(tmp_path, backend=SIM, tuning=TUNING))
    often, once = build(cfg).strategy, build(cfg).strategy
    done, _, _ = _finals(often)
    measured = [(x.params, m) for x in done for m in x.points]
    for n in range(1, len(measured)):
        often.screen.calibrate(measured[:n])
    for strategy in (often, once):
        strategy.screen.calibrate(measured)
    assert often.screen.efficiency == once.screen.efficiency
    assert often.screen.deployment == once.screen.deployment
