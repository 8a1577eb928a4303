"""The DFlash drafter against a naive reference written from the method's description, the
anchor slot, the "output of layer i" tap convention and the drafter cache bookkeeping."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from core_helpers import BLOCK, MASK_TOKEN, PROMPTS, VOCAB, make_drafter, make_engine, make_target

from dflash_core import (
    AcceptanceProfile,
    DFlashProposer,
    DraftInput,
    OracleProposer,
    SamplingParams,
    Spec,
)
from dflash_core.models.layers import apply_rope, rope_tables
from dflash_core.models.step import Step


def _reference_block(drafter, features, block_embeds, start):
    """Every layer: K/V over [fused context ; normed block], queries from the block only, no mask."""
    cfg = drafter.config.layers
    ctx = drafter.hidden_norm(drafter.fc(features))  # [1, C, H]
    positions = torch.arange(start + block_embeds.shape[1])[None]
    cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, positions)
    h = block_embeds
    for layer in drafter.layers:
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        both = torch.cat([ctx, x], dim=1)
        q = attn.q_norm(attn.q_proj(x).unflatten(-1, (cfg.num_attention_heads, -1))).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(both).unflatten(-1, (cfg.num_key_value_heads, -1))).transpose(1, 2)
        v = attn.v_proj(both).unflatten(-1, (cfg.num_key_value_heads, -1)).transpose(1, 2)
        q = apply_rope(q, cos[:, start:], sin[:, start:])
        k = apply_rope(k, cos, sin)
        groups = cfg.num_attention_heads // cfg.num_key_value_heads
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        out = F.scaled_dot_product_attention(q, k, v)  # non-causal
        h = h + attn.o_proj(out.transpose(1, 2).flatten(2))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return drafter.norm(h)


def _features(target, tokens, taps=(0, 2)):
    step = Step.causal(torch.zeros(1, dtype=torch.long), len(tokens), 0)
    _, feats = target(torch.tensor([tokens]), step, target.allocate_cache(1, len(tokens)), taps)
    return feats


@torch.inference_mode()
def test_drafter_matches_the_reference_when_context_arrives_over_several_rounds():
    target, drafter = make_target(), make_drafter()
    tokens = [5, 3, 9, 1, 7, 2, 8, 4, 6]
    feats = _features(target, tokens)  # [1, 9, F]
    proposer = DFlashProposer(drafter, target)
    proposer.begin(1, 64)
    for start, previous in ((4, 0), (7, 4), (9, 7)):  # context committed in three chunks
        anchor = torch.tensor([tokens[start] if start < len(tokens) else 11])
        draft = DraftInput(feats[:, previous:start], torch.arange(previous, start)[None],
                           anchor, torch.tensor([start]), start, BLOCK)
        logits = proposer.propose(draft)  # [1, L, V]
        block = torch.tensor([[int(anchor)] + [MASK_TOKEN] * (BLOCK - 1)])
        expected = _reference_block(drafter, feats[:, :start], target.embed(block), start)
        torch.testing.assert_close(logits, target.logits(expected[:, 1:]), atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_a_shorter_block_than_trained_drafts_its_prefix_positions():
    target, drafter = make_target(), make_drafter()
    feats = _features(target, PROMPTS[0])
    proposer = DFlashProposer(drafter, target)
    proposer.begin(1, 64)
    start = len(PROMPTS[0])
    draft = DraftInput(feats, torch.arange(start)[None], torch.tensor([2]), torch.tensor([start]),
                       start, 3)
    block = torch.tensor([[2, MASK_TOKEN, MASK_TOKEN]])
    expected = _reference_block(drafter, feats, target.embed(block), start)
    torch.testing.assert_close(proposer.propose(draft), target.logits(expected[:, 1:]),
                               atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_taps_are_the_outputs_of_the_listed_layers_in_listed_order():
    target = make_target()
    tokens = torch.tensor([PROMPTS[2]])
    step = Step.causal(torch.zeros(1, dtype=torch.long), tokens.shape[1], 0)
    _, feats = target(tokens, step, target.allocate_cache(1, 16), [2, 0])
    h, outputs = target.embed(tokens), []
    rope = rope_tables(target.config.head_dim, target.config.rope_theta, step.positions)
    cache = target.allocate_cache(1, 16)
    for layer in target.model.layers:
        h = layer(h, rope, step, cache)
        outputs.append(h)
    torch.testing.assert_close(feats, torch.cat([outputs[2], outputs[0]], -1))


class _SteeredDFlash(DFlashProposer):
    """Runs the real drafter (so its cache is maintained) but returns oracle logits, so rounds
    commit several tokens and the context arrives in chunks of varying size."""

    def __init__(self, drafter, target, oracle):
        super().__init__(drafter, target)
        self.oracle = oracle

    def begin(self, batch, capacity):
        super().begin(batch, capacity)
        self.oracle.begin(batch, capacity)

    def propose(self, draft):
        super().propose(draft)
        return self.oracle.propose(draft)


@torch.inference_mode()
def test_drafter_cache_holds_exactly_the_committed_context():
    target, drafter = make_target(), make_drafter()
    plain = make_engine(target).generate(PROMPTS[:1], SamplingParams(max_tokens=60))
    oracle = OracleProposer([PROMPTS[0] + plain.tokens[0]], VOCAB, BLOCK,
                            AcceptanceProfile.constant(BLOCK - 1, 0.7, 0.2))
    proposer = _SteeredDFlash(drafter, target, oracle)
    result = make_engine(target, proposer).generate(PROMPTS[:1], SamplingParams(max_tokens=40),
                                                    Spec.ddtree(BLOCK, 10, spine=True))
    assert max(result.stats.acceptance) >= 3
    committed = PROMPTS[0] + result.tokens[0][:-1]
    fresh = drafter.allocate_cache(1, 64)
    drafter.write_context(_features(target, committed), torch.arange(len(committed))[None], fresh)
    checked = len(committed) - BLOCK  # the last round's features are never drafted from
    torch.testing.assert_close(proposer.cache.k[:, 0, :, :checked], fresh.k[:, 0, :, :checked],
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(proposer.cache.v[:, 0, :, :checked], fresh.v[:, 0, :, :checked],
                               atol=1e-5, rtol=1e-5)
