"""Trials recorded while a DDTree round cap of 0 meant "no cap" read back in today's meaning."""

from __future__ import annotations

from tuner.records.study import (TrialRecord, load_trials, load_winner, save_trial,
                                 save_winner)
from tuner.records.tables import connect

OLD = {"tp_size": 1, "speculative_algorithm": "ddtree", "speculative_dflash_block_size": 8,
       "speculative_ddtree_budget": 16, "speculative_ddtree_topk": 4,
       "speculative_ddtree_round_tokens": 0}


def test_a_stored_round_cap_of_zero_reads_back_as_no_cap(tmp_path):
    db = connect(f"sqlite:///{tmp_path / 'results.db'}")
    for number, cap in enumerate((0, 64)):
        params = {**OLD, "speculative_ddtree_round_tokens": cap}
        save_trial(db, "old", TrialRecord(number, "model", params, "ok", True, "", {}, "", {}),
                   [])
    save_winner(db, "old", OLD)
    uncapped, capped = load_trials(db, "old")
    assert uncapped.launch is not None and not uncapped.launch.round_capped
    assert uncapped.params["speculative_ddtree_round_tokens"] is None
    assert capped.launch.speculative_ddtree_round_tokens == 64
    assert load_winner(db, "old")["speculative_ddtree_round_tokens"] is None
