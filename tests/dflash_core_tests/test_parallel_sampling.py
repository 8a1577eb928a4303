"""T > 0 under TP2: the first tokens follow the single-device distribution, and the same seed
draws the same tokens (every rank holds the same generator state)."""

from __future__ import annotations

import pytest
import torch
from parallel_helpers import single_device, start

from dflash_core import ModelConfig, SamplingParams, Target
from dflash_core.models.loader import save_model

pytestmark = pytest.mark.slow  # each starts its ranks (seconds on 2 cores)


def _tiny_sampling_target(folder) -> None:
    """Six tokens, one KV head: TP2 replicates it; T = 1 spreads mass over the vocabulary."""
    torch.manual_seed(5)
    save_model(Target(ModelConfig(vocab_size=6, hidden_size=16, intermediate_size=32,
                                  num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=8, rope_theta=10_000.0)),
               folder)


def test_tp2_samples_the_single_device_distribution(tmp_path):
    _tiny_sampling_target(tmp_path)
    engine = dict(max_batch=64, max_context=8, max_tree_nodes=1)
    single = single_device(tmp_path, None, engine)
    ranks = start(tmp_path, None, tp=2, engine=engine)
    prompt, counts, same, total = [1, 4, 2], torch.zeros(6), 0, 0
    try:
        with torch.inference_mode():
            for seed in range(10):
                sampling = SamplingParams(temperature=1.0, max_tokens=2, seed=seed)
                tp2 = ranks.engine.generate([prompt] * 64, sampling).tokens
                one = single.generate([prompt] * 64, sampling).tokens
                same += sum(a == b for a, b in zip(tp2, one))
                total += len(tp2)
                for tokens in tp2:
                    counts[tokens[0]] += 1
            exact = single.target.logits(single.target(
                torch.tensor([prompt]), _causal(len(prompt)))[0][0, -1]).softmax(-1)
    finally:
        ranks.close()
    assert same / total > 0.98  # the same generator state draws the same tokens
    assert 0.5 * (counts / counts.sum() - exact).abs().sum() < 0.08  # noise alone ~0.03
    assert (counts > 0).sum() >= 4  # really sampled, not greedy


def _causal(n: int):
    from dflash_core.models.step import Step

    return Step.causal(torch.zeros(1, dtype=torch.long), n, 0)
