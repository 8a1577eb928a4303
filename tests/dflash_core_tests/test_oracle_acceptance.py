"""With drafts steered to a known profile, the acceptance histogram is the one the profile implies:
a chain continues at depth d with P(top1[d]); a tree holding the whole top-2 lattice continues
with P(top1[d] + second[d]). Exercises deep paths, non-first siblings and full-depth rounds."""

from __future__ import annotations

import math

import pytest
from core_helpers import BLOCK, PROMPTS, VOCAB, make_target

from dflash_core import (
    AcceptanceProfile,
    Engine,
    EngineConfig,
    OracleProposer,
    SamplingParams,
    Spec,
)

PROFILE = AcceptanceProfile(top1=[0.9, 0.8, 0.7, 0.6, 0.5], second=[0.05, 0.1, 0.2, 0.3, 0.4])
TOKENS = 300
LATTICE = sum(2**d for d in range(1, BLOCK))  # every top-2 prefix up to depth 5: 62 nodes


def expected_histogram(continue_p: list[float]) -> dict[int, float]:
    """P(tau = k): the first k-1 depths accepted, depth k not (tau = L + 1 if all are)."""
    hist, reach = {}, 1.0
    for k, p in enumerate(continue_p, start=1):
        hist[k] = reach * (1 - p)
        reach *= p
    hist[len(continue_p) + 1] = reach
    return hist


@pytest.fixture(scope="module")
def oracle_engine():
    target = make_target()
    config = EngineConfig(max_batch=4, max_context=TOKENS + 40, max_tree_nodes=LATTICE + 1)
    plain = Engine(target, None, config).generate(PROMPTS, SamplingParams(max_tokens=TOKENS + 20))
    references = [p + t for p, t in zip(PROMPTS, plain.tokens)]
    oracle = OracleProposer(references, VOCAB, BLOCK, PROFILE, seed=0)
    return Engine(target, oracle, config), plain


@pytest.mark.parametrize("spec, continue_p", [
    (Spec.dflash(BLOCK), PROFILE.top1),
    (Spec.ddtree(BLOCK, LATTICE, topk=2), [a + b for a, b in zip(PROFILE.top1, PROFILE.second)]),
], ids=["dflash-chain", "ddtree-top2-lattice"])
def test_acceptance_histogram_matches_the_profile(oracle_engine, spec, continue_p):
    engine, plain = oracle_engine
    result = engine.generate(PROMPTS, SamplingParams(max_tokens=TOKENS), spec)
    assert result.tokens == [t[:TOKENS] for t in plain.tokens]  # still lossless
    counts = result.stats.acceptance
    total = sum(counts.values())
    expected = expected_histogram(continue_p)
    tv = 0.5 * sum(abs(counts.get(k, 0) / total - p) for k, p in expected.items())
    assert total > 200 and tv < 0.06, (dict(counts), expected)
    mean = sum(k * p for k, p in expected.items())
    assert math.isclose(result.stats.mean_acceptance, mean, rel_tol=0.06)


def test_perfect_drafts_fill_every_round_to_full_depth():
    target = make_target()
    plain = Engine(target).generate(PROMPTS[:1], SamplingParams(max_tokens=40))
    oracle = OracleProposer([PROMPTS[0] + plain.tokens[0]], VOCAB, BLOCK,
                            AcceptanceProfile.constant(BLOCK - 1, 1.0), seed=0)
    engine = Engine(target, oracle)
    for spec in (Spec.dflash(BLOCK), Spec.ddtree(BLOCK, 8, spine=True)):
        result = engine.generate(PROMPTS[:1], SamplingParams(max_tokens=31), spec)
        assert dict(result.stats.acceptance) == {BLOCK: 5}  # 1 + 5 rounds x 6 tokens = 31
        assert result.tokens[0] == plain.tokens[0][:31]
