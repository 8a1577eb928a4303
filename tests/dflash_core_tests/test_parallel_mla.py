"""DeepSeek-V3 / Kimi K2 (MLA, INT4 routed experts) over ranks: TP2, TP2+EP2 and TP4+EP2 on the
tiny random Kimi-shaped target give the single-device greedy tokens for plain, DFlash and DDTree
(drafted by an oracle, so drafts are really accepted; requests joining mid-flight too), hold only
their slices of the weights but the whole latent, and compute the single-device logits.

One set of ranks per layout (a module fixture): every check of that layout runs on it."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from parallel_helpers import PROMPTS, oracle_for, plain_tokens, single_device
from parallel_helpers import assert_lossless_with_drafts, start, tokens_joining_mid_flight

from dflash_core import Spec
from dflash_core.models.int4 import PACK
from dflash_core.models.random_checkpoint import write_random_pair
from dflash_core.models.random_checkpoint_deepseek import VOCAB, kimi_like_config
from dflash_core.models.step import Step
from dflash_core.parallel.modules_deepseek import LocalInt4Experts

pytestmark = pytest.mark.slow  # each layout starts its ranks (seconds on 2 cores)

BLOCK = 8  # the Kimi-shaped drafter's
PROBE = torch.tensor([[5, 17, 250, 3, 99, 411, 7, 64, 300, 12]])  # [1, 10] ids
# fp32 on both sides; tp only reorders sums (o_proj's and the MLPs' partial sums over ranks):
# measured at most 8.3e-7 on logits up to 2.1 (a few ulps), ten times under this tolerance and
# far under the probe's smallest top-2 gap (0.027), so greedy choices cannot flip.
LOGITS_TOL = dict(atol=1e-5, rtol=1e-5)


def probe_logits(target) -> torch.Tensor:
    """One forward of PROBE (no cache) -> [1, 10, V] logits, on every rank at once."""
    step = Step.causal(torch.zeros(1, dtype=torch.long), PROBE.shape[1], 0)
    with torch.inference_mode():
        hidden, _ = target(PROBE, step)
        return target.logits(hidden)


def probe_then_oracle(out: Path, references, target):
    """Build-time hook run by every rank on its own shards: the collectives of the probe line
    up because every rank builds at once. Rank 0 keeps the logits; then the oracle proposer."""
    logits = probe_logits(target)
    if target.comm.rank == 0:
        torch.save(logits, out)
    return oracle_for(references, VOCAB, BLOCK, target)


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    target, _ = write_random_pair("deepseek-v3", tmp_path_factory.mktemp("kimi"), seed=0)
    engine = single_device(target, None)
    reference = plain_tokens(engine)
    return target, engine, reference


@pytest.fixture(scope="module", params=[(2, 1), (2, 2), (4, 2)], ids=["tp2", "tp2-ep2", "tp4-ep2"])
def kimi_ranks(request, kimi, tmp_path_factory):
    target, _, reference = kimi
    truth = [p + t for p, t in zip(PROMPTS, reference)]
    out = tmp_path_factory.mktemp("probe") / "logits.pt"
    tp, ep = request.param
    ranks = start(target, None, tp, ep, proposer=functools.partial(probe_then_oracle, out, truth))
    yield ranks, torch.load(out), tp, ep
    ranks.close()


def test_mla_ranks_give_the_single_device_tokens(kimi, kimi_ranks):
    _, _, reference = kimi
    ranks = kimi_ranks[0]
    for run in assert_lossless_with_drafts(ranks.engine, reference, BLOCK):
        assert run.stats.comm.calls["broadcast"] == run.stats.rounds  # one host message a round


def test_mla_ranks_take_requests_mid_flight(kimi, kimi_ranks):
    spec = Spec.ddtree(BLOCK, 2 * BLOCK, topk=3)
    assert tokens_joining_mid_flight(kimi_ranks[0].engine, spec) == kimi[2]


def test_mla_ranks_compute_the_single_device_logits(kimi, kimi_ranks):
    engine, logits = kimi[1], kimi_ranks[1]
    full = probe_logits(engine.target)
    torch.testing.assert_close(logits, full, **LOGITS_TOL)
    assert torch.equal(logits.argmax(-1), full.argmax(-1))


def test_mla_rank_holds_its_heads_and_experts_but_the_whole_latent(kimi, kimi_ranks):
    engine, (ranks, _, tp, ep) = kimi[1], kimi_ranks
    cfg, full, part = kimi_like_config(), engine.target, ranks.engine.target
    heads = cfg.num_attention_heads // tp  # rank 0's: the first ones
    whole, attn = full.model.layers[1].self_attn, part.model.layers[1].self_attn
    q_rows = heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
    kv_rows = heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    torch.testing.assert_close(attn.q_b_proj.weight, whole.q_b_proj.weight[:q_rows])
    torch.testing.assert_close(attn.kv_b_proj.weight, whole.kv_b_proj.weight[:kv_rows])
    torch.testing.assert_close(attn.o_proj.weight,
                               whole.o_proj.weight[:, :heads * cfg.v_head_dim])
    torch.testing.assert_close(attn.kv_a_proj_with_mqa.weight, whole.kv_a_proj_with_mqa.weight)
    # The latent is not split: every rank caches all of it (no KV saving from tp).
    assert ranks.engine.cache.kv.shape[-1] == cfg.kv_lora_rank + cfg.qk_rope_head_dim
    moe, whole_moe = part.model.layers[1].mlp, full.model.layers[1].mlp
    assert moe.gate.weight.dtype == torch.float32
    torch.testing.assert_close(moe.gate.weight, whole_moe.gate.weight)  # replicated router
    experts, inner = moe.experts, cfg.moe_intermediate_size * ep // tp
    assert isinstance(experts, LocalInt4Experts)
    assert experts.num_experts == cfg.n_routed_experts // ep and experts.intermediate == inner
    # Rank 0: the first experts, the first columns of each down_proj (whole packed words).
    local = whole_moe.experts.down_packed[: experts.num_experts, :, : inner // PACK]
    assert torch.equal(experts.down_packed, local)
    gate_rows = whole_moe.experts.gate_up_scale[: experts.num_experts, :inner]
    assert torch.equal(experts.gate_up_scale[:, :inner], gate_rows)
    shared = moe.shared_experts.down_proj.weight
    assert shared.shape[1] * tp == cfg.moe_intermediate_size * cfg.n_shared_experts

