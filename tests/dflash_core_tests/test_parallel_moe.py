"""Expert parallelism on a random Qwen3-MoE: TP2 (experts split inside), TP2+EP2 (experts split
over the ranks) and TP4+EP2 (both, 4 ranks) give the single-device greedy tokens for plain, DFlash
and DDTree, drafted by an oracle so that drafts are really accepted."""

from __future__ import annotations

import pytest
from parallel_helpers import PROMPTS, oracle, plain_tokens, random_pair, single_device
from parallel_helpers import assert_lossless_with_drafts, start

from dflash_core.models.random_checkpoint import BLOCK, VOCAB

pytestmark = pytest.mark.slow  # each starts its ranks (seconds on 2 cores)


@pytest.mark.parametrize("tp, ep", [(2, 1), (2, 2), (4, 2)], ids=["tp2", "tp2-ep2", "tp4-ep2"])
def test_moe_layouts_give_the_single_device_tokens(tmp_path, tp, ep):
    target, _ = random_pair(tmp_path, "qwen3-moe")
    reference = plain_tokens(single_device(target, None))
    truth = [p + t for p, t in zip(PROMPTS, reference)]
    ranks = start(target, None, tp, ep, proposer=oracle(truth, VOCAB, BLOCK))
    try:
        assert_lossless_with_drafts(ranks.engine, reference, BLOCK)
    finally:
        ranks.close()
