"""No false winner: a configuration that was lucky once loses to one that is good every time,
and a noisy study names nothing until its finalists were re-measured."""

from __future__ import annotations

import pytest

from tuner.errors import NoResultError
from tuner.records import GATES_PASSED
from tuner.records import TrialRecord
from tuner.selection import Ranking
from tuner.selection import choose
from tuner.selection import config_key
from tuner.sla import Limit

NOISY = Ranking(min_runs=3, penalty=1.0, prior_rel_sd=0.2)


def run(number: int, algo: str, tok_s: float, status: str = "ok", excerpt: str = "") -> TrialRecord:
    row = {"output_tok_s": tok_s, "tok_s_per_user": tok_s / 100, "failure": None,
           "tpot_p50_ms": 10.0}
    return TrialRecord(number, "simulated", {"speculative_algorithm": algo}, status, True, "",
                       {}, excerpt, {1: row, 128: row})


def test_a_single_lucky_run_never_wins_without_re_measurement():
    trials = [run(0, "ddtree", 3000.0)] + [run(i, "dflash", 2000.0 + i) for i in range(1, 4)]
    chosen, _ = choose(trials, 128, [], ranking=NOISY)
    assert chosen.params["speculative_algorithm"] == "dflash" and chosen.runs == 3


def test_a_lucky_configuration_re_measured_to_its_real_level_loses():
    trials = ([run(0, "ddtree", 3000.0), run(4, "ddtree", 1500.0), run(5, "ddtree", 1600.0)]
              + [run(i, "dflash", 2000.0) for i in range(1, 4)])
    chosen, _ = choose(trials, 128, [], ranking=NOISY)
    assert chosen.params["speculative_algorithm"] == "dflash"


def test_nothing_is_chosen_before_any_configuration_was_re_measured():
    with pytest.raises(NoResultError, match="measured 3 times"):
        choose([run(0, "ddtree", 3000.0), run(1, "dflash", 2000.0)], 128, [], ranking=NOISY)


def test_a_configuration_with_a_failed_run_or_gate_is_out():
    good = [run(i, "dflash", 2000.0) for i in range(3)]
    crashed = [run(3 + i, "ddtree", 2500.0) for i in range(3)] + [run(6, "ddtree", 0, "crash")]
    gated = [run(7 + i, "none", 2600.0) for i in range(2)] + [
        run(9, "none", 2600.0, "disqualified", "gate losslessness: ...")]
    chosen, _ = choose(good + crashed + gated, 128, [], ranking=NOISY)
    assert chosen.params["speculative_algorithm"] == "dflash"


def test_a_launch_aware_ranking_takes_only_gated_configurations():
    plain = [run(i, "ddtree", 3000.0) for i in range(3)]
    gated = [run(3 + i, "dflash", 2000.0) for i in range(2)] + [
        run(5, "dflash", 2000.0, excerpt=GATES_PASSED)]
    ranking = Ranking(point="at_sla_limit", min_runs=3, prior_rel_sd=0.2, gated_only=True)
    chosen, _ = choose(plain + gated, 128, [], ranking=ranking)
    assert chosen.params["speculative_algorithm"] == "dflash"
    with pytest.raises(NoResultError, match="integrity gates"):
        choose(plain, 128, [], ranking=ranking)


def test_the_winner_a_launch_aware_study_crowned_stands_while_it_qualifies():
    gated = [run(i, "dflash", 2000.0, excerpt=GATES_PASSED) for i in range(3)]
    crowned = [run(3 + i, "ddtree", 1900.0, excerpt=GATES_PASSED) for i in range(3)]
    ranking = Ranking(point="at_sla_limit", min_runs=3, prior_rel_sd=0.2, gated_only=True,
                      winner=config_key({"speculative_algorithm": "ddtree"}))
    chosen, front = choose(gated + crowned, 128, [], ranking=ranking)
    assert chosen.params["speculative_algorithm"] == "ddtree" and front[0] is chosen
    # Under an SLA it misses, the ranking decides again.
    slow = [run(6 + i, "none", 100.0, excerpt=GATES_PASSED) for i in range(3)]
    for t in crowned:
        t.measurements = {c: {**row, "tpot_p50_ms": 50.0} for c, row in t.measurements.items()}
    chosen, _ = choose(gated + crowned + slow, 128, [Limit.parse("tpot_p50_ms<=20")],
                       ranking=ranking)
    assert chosen.params["speculative_algorithm"] == "dflash"
