"""The shipped (or rebuilt) trained pair: its drafter really drafts, and the engine stays
lossless on real prompts. A broken drafter or engine cannot hide behind random weights here."""

from __future__ import annotations

import pytest
from reference import MaskedAnchorProposer

from dflash_core import SamplingParams, Spec
from dflash_core.training.evaluate import held_out_prompts, load_pair, pair_engine
from dflash_core.training.pair import ensure_pair
from dflash_core.training.tokenizer import load_tokenizer

TOKENS = 48


@pytest.fixture(scope="module")
def pair():
    directory = ensure_pair()
    target, drafter = load_pair(directory)
    prompts = held_out_prompts(directory)[:16]
    engine = pair_engine(target, drafter, prompts, TOKENS)
    plain = engine.generate(prompts, SamplingParams(max_tokens=TOKENS), Spec.none())
    return directory, engine, prompts, plain


def _run(engine, prompts, spec):
    return engine.generate(prompts, SamplingParams(max_tokens=TOKENS), spec)


def test_dflash_accepts_well_over_one_token_per_round(pair):
    _, engine, prompts, plain = pair
    result = _run(engine, prompts, Spec.dflash(8))
    assert result.tokens == plain.tokens
    assert result.stats.mean_acceptance > 1.5


def test_ddtree_accepts_more_than_dflash_on_the_same_drafter(pair):
    _, engine, prompts, plain = pair
    chain = _run(engine, prompts, Spec.dflash(8))
    tree = _run(engine, prompts, Spec.ddtree(8, 32))
    assert tree.tokens == plain.tokens
    assert tree.stats.mean_acceptance >= 1.15 * chain.stats.mean_acceptance


def test_acceptance_grows_with_block_size(pair):
    _, engine, prompts, _ = pair
    taus = [_run(engine, prompts, Spec.dflash(bs)).stats.mean_acceptance for bs in (2, 4, 8)]
    assert taus == sorted(taus) and taus[-1] > taus[0] + 1.0


def test_mask_in_the_anchor_slot_collapses_acceptance(pair):
    """The porting bug the DFlash note warns about: slot 0 must hold the real anchor."""
    _, engine, prompts, plain = pair
    good = _run(engine, prompts, Spec.dflash(8)).stats.mean_acceptance
    proposer = engine.proposer
    engine.proposer = MaskedAnchorProposer(proposer.drafter, engine.target)
    try:
        masked = _run(engine, prompts, Spec.dflash(8))
    finally:
        engine.proposer = proposer  # the engine is shared by the module's other tests
    assert masked.tokens == plain.tokens  # still lossless, just slower
    assert masked.stats.mean_acceptance < good - 1.0


def test_held_out_prompts_are_python_source(pair):
    directory, *_ = pair
    text = load_tokenizer(directory / "target").decode(held_out_prompts(directory)[0])
    assert len(text) > 100 and any(word in text for word in ("def ", "import", "self", "return",
                                                              "=", "#"))
