"""A DDTree round cap (Spec.round_tokens): the tree shrinks with the rows a round runs over."""

from __future__ import annotations

import pytest
from core_helpers import BLOCK, PROMPTS, make_engine, make_target, oracle_engine

from dflash_core import AcceptanceProfile, Engine, SamplingParams, Spec
from dflash_core.speculation.spec import budget_at_rows

GREEDY = SamplingParams(max_tokens=24)


def test_the_budget_shrinks_with_rows_down_to_the_chain_and_never_grows():
    capped = Spec.ddtree(8, 32, topk=4, round_tokens=64)
    assert [capped.at_rows(n).budget for n in (1, 2, 3, 4, 8, 16)] == [32, 31, 20, 15, 7, 7]
    assert capped.at_rows(4) == Spec.ddtree(8, 15, topk=4)  # the result carries no cap
    assert capped.num_nodes == 33  # the most, which sizes the engine
    assert Spec.ddtree(8, 3, round_tokens=8).at_rows(4).budget == 3  # below the chain: kept
    uncapped = Spec.ddtree(8, 32)
    assert uncapped.at_rows(8) is uncapped and Spec.dflash(8).at_rows(8) == Spec.dflash(8)
    assert budget_at_rows(32, 8, None, 8) == 32  # None: no cap


def test_a_round_cap_is_refused_where_it_means_nothing():
    for nothing in (-1, 0):  # no cap is None, never a count of 0
        with pytest.raises(ValueError, match="round_tokens must be >= 1, or None for no cap"):
            Spec.ddtree(8, 16, round_tokens=nothing)
    with pytest.raises(ValueError, match="only ddtree has a round_tokens cap"):
        Spec("dflash", 8, round_tokens=64)
    assert Spec.of("dflash", 8, round_tokens=64) == Spec.dflash(8)  # dropped, as budget is


def _oracle_engine(rows_bucket: int) -> Engine:
    """Oracle drafts (deep acceptance), every round over `rows_bucket` rows whatever the live
    requests."""
    profile = AcceptanceProfile.constant(BLOCK - 1, 0.75, 0.2)
    return oracle_engine(profile, batch_buckets=(rows_bucket,))[0]


def test_a_capped_round_runs_the_tree_of_its_rows_and_stays_lossless():
    capped = Spec.ddtree(BLOCK, 24, round_tokens=24)  # 4 rows: 24 // 4 - 1 = 5 nodes a row
    runs = {name: _oracle_engine(4).generate(PROMPTS, GREEDY, spec) for name, spec in (
        ("capped", capped), ("b5", Spec.ddtree(BLOCK, 5)), ("b24", Spec.ddtree(BLOCK, 24)))}
    plain = make_engine(make_target()).generate(PROMPTS, GREEDY, Spec.none())
    assert all(run.tokens == plain.tokens for run in runs.values())
    assert runs["capped"].stats.acceptance == runs["b5"].stats.acceptance
    assert runs["capped"].stats.rounds == runs["b5"].stats.rounds
    assert runs["capped"].stats.acceptance != runs["b24"].stats.acceptance
    one_row = Spec.ddtree(BLOCK, 24, round_tokens=64)  # one row: the whole budget
    alone = _oracle_engine(1).generate(PROMPTS[:1], GREEDY, one_row)
    assert alone.stats.acceptance == \
        _oracle_engine(1).generate(PROMPTS[:1], GREEDY, Spec.ddtree(BLOCK, 24)).stats.acceptance
