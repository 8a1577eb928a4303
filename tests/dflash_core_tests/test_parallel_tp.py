"""TP2 on the shipped pair gives the single-device plain greedy tokens: plain, DFlash and DDTree
(a budget with siblings), a batch of mixed prompt lengths, and requests joining mid-flight.

One set of ranks per process at a time: the module's ranks serve every test here."""

from __future__ import annotations

import pytest
import torch
from parallel_helpers import GREEDY, PROMPTS, SHIPPED, plain_tokens, single_device, specs, start
from parallel_helpers import tokens_joining_mid_flight

from dflash_core import Spec

pytestmark = pytest.mark.slow  # each starts its ranks (seconds on 2 cores)


@pytest.fixture(scope="module")
def shipped():
    return single_device(SHIPPED / "target", SHIPPED / "drafter")


@pytest.fixture(scope="module")
def shipped_tp2():
    ranks = start(SHIPPED / "target", SHIPPED / "drafter", tp=2)
    yield ranks
    ranks.close()


def test_tp2_rank_holds_half_the_weights_and_its_own_kv_heads(shipped, shipped_tp2):
    full, half = shipped.target, shipped_tp2.engine.target
    attn, whole = half.model.layers[0].self_attn, full.model.layers[0].self_attn
    assert attn.q_proj.weight.shape[0] * 2 == whole.q_proj.weight.shape[0]
    assert half.model.embed_tokens.weight.shape[0] * 2 == full.config.vocab_size
    assert half.lm_head.weight is half.model.embed_tokens.weight  # still tied
    torch.testing.assert_close(attn.o_proj.weight, whole.o_proj.weight[:, :attn.n_heads * 32])
    assert shipped_tp2.engine.cache.k.shape[2] == full.config.num_key_value_heads // 2


def test_tp2_gives_the_single_device_tokens_for_plain_dflash_and_ddtree(shipped, shipped_tp2):
    reference = plain_tokens(shipped)
    for spec in specs(8):
        with torch.inference_mode():
            run = shipped_tp2.engine.generate(PROMPTS, GREEDY, spec)
        assert run.tokens == reference, spec
        if spec.method != "none":  # the trained drafter's drafts were accepted
            assert run.stats.mean_acceptance > 2.0, (spec, run.stats.acceptance)
        calls = run.stats.comm.calls
        assert calls["all_reduce"] > 0 and calls["all_gather"] > 0
        assert calls["broadcast"] == run.stats.rounds  # one host message per round


def test_tp2_live_batch_takes_requests_mid_flight(shipped, shipped_tp2):
    spec = Spec.ddtree(8, 16, topk=3)
    assert tokens_joining_mid_flight(shipped_tp2.engine, spec) == plain_tokens(shipped)
