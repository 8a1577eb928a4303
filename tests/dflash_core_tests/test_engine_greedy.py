"""Greedy speculative decoding is lossless: DFlash == DDTree == plain greedy, token for token."""

from __future__ import annotations

import pytest
from core_helpers import (
    BLOCK,
    PROMPTS,
    VOCAB,
    dflash_engine,
    make_drafter,
    make_engine,
    make_target,
    oracle_engine,
)

from dflash_core import AcceptanceProfile, DFlashProposer, SamplingParams, Spec

SPECS = [
    pytest.param(Spec.dflash(BLOCK), id="dflash-6"),
    pytest.param(Spec.dflash(3), id="dflash-3"),
    pytest.param(Spec.ddtree(BLOCK, 1), id="ddtree-b1"),
    pytest.param(Spec.ddtree(BLOCK, 4), id="ddtree-b4"),
    pytest.param(Spec.ddtree(BLOCK, 4, spine=True), id="ddtree-b4-spine"),
    pytest.param(Spec.ddtree(BLOCK, 24, topk=3, spine=True), id="ddtree-b24-k3-spine"),
    pytest.param(Spec.ddtree(BLOCK, 40, max_depth=3), id="ddtree-b40-d3"),
    pytest.param(Spec.ddtree(BLOCK, 24, round_tokens=12), id="ddtree-b24-r12"),
]
GREEDY = SamplingParams(max_tokens=24)


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def engine(request):
    return dflash_engine(moe=request.param)


@pytest.fixture(scope="module")
def plain(engine):
    return engine.generate(PROMPTS, GREEDY, Spec.none())


@pytest.mark.parametrize("spec", SPECS)
def test_speculative_greedy_equals_plain_greedy_batched(engine, plain, spec):
    result = engine.generate(PROMPTS, GREEDY, spec)
    assert result.tokens == plain.tokens
    assert all(len(t) == GREEDY.max_tokens for t in result.tokens)


@pytest.mark.parametrize("spec", [SPECS[0], SPECS[5]])
def test_batch_of_one_equals_the_batched_run(engine, plain, spec):
    for prompt, expected in zip(PROMPTS, plain.tokens):
        assert engine.generate([prompt], GREEDY, spec).tokens == [expected]


def test_plain_decoding_takes_one_round_per_token(engine, plain):
    assert plain.stats.rounds == GREEDY.max_tokens - 1  # the first token comes from prefill
    assert set(plain.stats.acceptance) == {1}


@pytest.mark.parametrize("spec", SPECS)
def test_steered_drafts_accept_deep_and_stay_lossless(spec):
    engine, references = oracle_engine(AcceptanceProfile.constant(BLOCK - 1, 0.75, 0.2))
    result = engine.generate(PROMPTS, GREEDY, spec)
    assert result.tokens == [r[: GREEDY.max_tokens] for r in references]
    assert max(result.stats.acceptance) > 1  # multi-token rounds really happened


def test_stop_token_truncates_like_plain_decoding(engine, plain):
    stop = plain.tokens[0][5]
    sampling = SamplingParams(max_tokens=24, stop_token_ids=(stop,))
    for spec in (Spec.none(), Spec.ddtree(BLOCK, 12, spine=True)):
        result = engine.generate(PROMPTS, sampling, spec)
        for got, full in zip(result.tokens, plain.tokens):
            cut = full.index(stop) + 1 if stop in full else len(full)
            assert got == full[:cut]
        assert result.finish_reasons[0] == "stop"


def test_each_request_has_its_own_max_tokens_budget_and_context_limit():
    engine = dflash_engine()
    result = engine.generate(PROMPTS, SamplingParams(max_tokens=7), Spec.dflash(BLOCK))
    assert [len(t) for t in result.tokens] == [7] * len(PROMPTS)
    assert set(result.finish_reasons) == {"max_tokens"}
    long_prompt = [i % 40 + 1 for i in range(149)]  # max_context is 160
    result = engine.generate([long_prompt], SamplingParams(max_tokens=100), Spec.dflash(BLOCK))
    assert len(long_prompt) + len(result.tokens[0]) == 160
    assert result.finish_reasons == ["length"]


@pytest.mark.parametrize("bad, message", [
    (dict(prompts=[]), "prompts"),
    (dict(prompts=[[]]), "prompt"),
    (dict(prompts=[[1, VOCAB]]), "token ids"),
    (dict(spec=Spec.dflash(BLOCK + 2)), "trained block"),
    (dict(spec=Spec.ddtree(BLOCK, 100)), "max_tree_nodes"),
])
def test_bad_requests_are_refused_with_a_reason(bad, message):
    engine = dflash_engine()
    args = dict(prompts=PROMPTS, spec=Spec.dflash(BLOCK)) | bad
    with pytest.raises(ValueError, match=message):
        engine.generate(args["prompts"], GREEDY, args["spec"])


def test_speculation_without_a_drafter_is_refused():
    with pytest.raises(ValueError, match="needs a drafter"):
        make_engine(make_target()).generate(PROMPTS, GREEDY, Spec.dflash(BLOCK))


@pytest.mark.gpu
@pytest.mark.parametrize("spec", [SPECS[0], SPECS[5]])
def test_cuda_engine_produces_the_cpu_tokens(spec):
    target = make_target().cuda()
    engine = make_engine(target, DFlashProposer(make_drafter().cuda(), target))
    cpu = make_engine(make_target()).generate(PROMPTS, GREEDY, Spec.none())
    assert engine.generate(PROMPTS, GREEDY, spec).tokens == cpu.tokens


def test_spec_from_a_method_name_keeps_only_what_the_method_uses():
    from dflash_core.speculation.spec import spec_for

    assert Spec.of("dflash", 8, budget=32) == Spec.dflash(8)
    assert Spec.of("ddtree", 8, 32, 4, 5, True) == Spec.ddtree(8, 32, 4, 5, True)
    assert spec_for("ddtree", 8, None, 16) == Spec.ddtree(8, 16)  # the trained block
    assert spec_for("none", None) == Spec.none()
    with pytest.raises(ValueError, match="needs a drafter"):
        spec_for("dflash", None)
    with pytest.raises(ValueError, match="one of"):
        Spec.of("eagle", 8)


def test_spec_knobs_are_named_like_the_tuning_parameters():
    """speculative_ddtree_topk / _max_depth / _budget, speculative_dflash_block_size."""
    from dflash_core.speculation.spec import spec_for

    spec = Spec.of("ddtree", block_size=8, budget=32, topk=4, max_depth=5, spine=True)
    assert (spec.block_size, spec.budget, spec.topk, spec.max_depth) == (8, 32, 4, 5)
    assert spec_for("ddtree", 8, None, 32, topk=4, max_depth=5, spine=True) == spec
    assert spec.tree_depth == 5  # the cap
    assert Spec.ddtree(8, 32).tree_depth == 7  # no depth cap: block_size - 1
    assert Spec.ddtree(8, 32).tree_width == 32  # no width cap: the budget
    assert Spec.ddtree(8, 3).tree_depth == 3  # a tree of 3 nodes is at most 3 deep
    assert Spec.dflash(8).tree_depth == 7 and Spec.none().tree_depth == 0
    with pytest.raises(ValueError, match=r"max_depth must be at most block_size - 1 = 7, got 8"):
        Spec.ddtree(8, 32, max_depth=8)
    for no_cap_is_not_zero in ({"topk": 0}, {"max_depth": 0}, {"topk": -1}):
        with pytest.raises(ValueError, match=">= 1, or None for no cap"):
            Spec.ddtree(8, 32, **no_cap_is_not_zero)


def test_stage_times_are_zeros_unless_stage_timing_is_asked_for():
    """Off by default: on a GPU without graphs it costs a sync at each of four stages."""
    from dflash_core import build_engine
    from dflash_core.runtime.stats import STAGES

    target = make_target()
    limits = dict(max_batch=4, max_context=160, max_tree_nodes=16)
    off = build_engine(target, make_drafter(), **limits).generate(PROMPTS, GREEDY,
                                                                   Spec.dflash(BLOCK))
    assert off.stats.stage_s == dict.fromkeys(STAGES, 0.0) and off.stats.wall_s > 0
    on = build_engine(target, make_drafter(), **limits, stage_timing=True).generate(
        PROMPTS, GREEDY, Spec.dflash(BLOCK))
    assert set(on.stats.stage_s) == set(STAGES) and on.stats.stage_s["round"] == 0.0  # no graphs
    assert all(on.stats.stage_s[s] > 0 for s in ("prefill", "draft", "build", "verify", "commit"))
    assert on.tokens == off.tokens
