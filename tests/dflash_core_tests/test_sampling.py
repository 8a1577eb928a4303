"""Speculative sampling at T > 0 draws from the same distribution as plain sampling.

On a tiny vocabulary the exact distribution of the 2nd and 3rd generated tokens is enumerated
from the target itself; plain, DFlash and DDTree samples must all fit it (fixed seeds)."""

from __future__ import annotations

import itertools

import pytest
import torch
from reference import filtered_logits, sample

from dflash_core import (
    DFlashProposer,
    Drafter,
    DrafterConfig,
    Engine,
    EngineConfig,
    ModelConfig,
    SamplingParams,
    Spec,
    Target,
)
from dflash_core.models.step import Step

VOCAB = 6
PROMPT = [1, 4, 2]
BATCH = 64
CALLS = 40  # 2,560 samples per method


def _tiny_pair():
    torch.manual_seed(5)
    layers = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=8, rope_theta=10_000.0)
    target = Target(ModelConfig(num_hidden_layers=2, **layers)).eval()
    drafter = Drafter(DrafterConfig(ModelConfig(num_hidden_layers=1, **layers), 4, [0, 1],
                                    VOCAB - 1)).eval()
    return target, drafter


def _next_probs(target, tokens, params):
    cache = target.allocate_cache(1, len(tokens))
    step = Step.causal(torch.zeros(1, dtype=torch.long), len(tokens), 0)
    hidden, _ = target(torch.tensor([tokens]), step, cache)
    return filtered_logits(target.logits(hidden[0, -1]), params).softmax(-1)


@torch.inference_mode()
def _exact_pairs(target, params) -> torch.Tensor:
    """P(t2, t3) marginalised over t1: [V, V]."""
    joint = torch.zeros(VOCAB, VOCAB)
    p1 = _next_probs(target, PROMPT, params)
    for t1, t2 in itertools.product(range(VOCAB), repeat=2):
        p2 = _next_probs(target, PROMPT + [t1], params)[t2]
        joint[t2] += p1[t1] * p2 * _next_probs(target, PROMPT + [t1, t2], params)
    return joint


def _sampled_pairs(engine, params, spec) -> tuple[torch.Tensor, dict]:
    counts, acceptance = torch.zeros(VOCAB, VOCAB), {}
    for call in range(CALLS):
        sampling = SamplingParams(params.temperature, params.top_k, params.top_p, max_tokens=3,
                                  seed=call)
        result = engine.generate([PROMPT] * BATCH, sampling, spec)
        for tokens in result.tokens:
            counts[tokens[1], tokens[2]] += 1
        for k, n in result.stats.acceptance.items():
            acceptance[k] = acceptance.get(k, 0) + n
    return counts / counts.sum(), acceptance


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=4, top_p=0.9),
], ids=["T1", "T0.7-topk4-topp0.9"])
def test_speculative_sampling_matches_the_exact_distribution(params):
    target, drafter = _tiny_pair()
    engine = Engine(target, DFlashProposer(drafter, target),
                    EngineConfig(max_batch=BATCH, max_context=16, max_tree_nodes=8))
    exact = _exact_pairs(target, params)
    for spec in (Spec.none(), Spec.dflash(4), Spec.ddtree(4, 6, topk=2)):
        pairs, acceptance = _sampled_pairs(engine, params, spec)
        tv_pairs = 0.5 * (pairs - exact).abs().sum()
        tv_next = 0.5 * (pairs.sum(1) - exact.sum(1)).abs().sum()
        # Sampling noise alone gives ~0.04-0.05 here; a biased sampler lands far above.
        assert tv_pairs < 0.07 and tv_next < 0.04, (spec.method, tv_pairs, tv_next)
        if spec.method != "none":
            assert sum(n for k, n in acceptance.items() if k > 1) > 200  # drafts were accepted


def test_top_k_and_top_p_keep_the_expected_tokens():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    top2 = filtered_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.isfinite(top2).tolist() == [[True, True, False, False, False]]
    probs = logits.softmax(-1)[0]  # 0.55, 0.20, 0.12, 0.07, 0.03 (approx.)
    nucleus = filtered_logits(logits, SamplingParams(temperature=1.0, top_p=0.7))
    kept = torch.isfinite(nucleus)[0]
    assert kept.tolist() == [True, True, False, False, False]
    assert probs[:1].sum() < 0.7 <= probs[:2].sum()


def test_sampling_is_reproducible_for_a_seed_and_greedy_ignores_the_generator():
    logits = torch.randn(3, 5, 10)
    params = SamplingParams(temperature=1.0)
    draws = [sample(logits, params, torch.Generator().manual_seed(1)) for _ in range(2)]
    assert torch.equal(draws[0], draws[1])
    assert torch.equal(sample(logits, SamplingParams(), None), logits.argmax(-1))
