"""The pair builder: corpus, tokenizer, schedules, the drafter's training forward, a tiny build
end to end (reproducible, public layouts), and building when missing."""

from __future__ import annotations

import json

import pytest
import torch
from core_helpers import BLOCK, make_drafter, make_target
from safetensors.torch import load_file

from dflash_core import DFlashProposer, DraftInput, load_drafter, load_target
from dflash_core.models.step import Step
from dflash_core.training.build import Recipe, build_pair
from dflash_core.training.corpus import load_corpus
from dflash_core.training.drafter_train import (
    DraftData,
    _block_mask,
    block_loss,
    default_gamma,
    draft_blocks,
)
from dflash_core.training.optim import Schedule
from dflash_core.training.pair import ensure_pair, is_complete
from dflash_core.training.tokenizer import MASK, train_tokenizer

TINY = Recipe(corpus_chars=150_000, vocab_size=384, hidden_size=64, target_layers=2, heads=4,
              kv_heads=2, intermediate_size=128, target_schedule=Schedule(12, 8, 32, 3e-3, 3),
              drafter_layers=1, block_size=4, taps=[0, 1], prompts=32, prompt_len=16,
              response_len=16, drafter_schedule=Schedule(12, 8, 0, 3e-3, 3), anchors_per_seq=4,
              eval_prompts=4)


def test_corpus_split_is_deterministic_and_disjoint():
    first, second = load_corpus(200_000), load_corpus(200_000)
    assert first.train == second.train and first.held_out == second.held_out
    assert first.train_chars >= 200_000 and first.held_out
    assert not set(first.train) & set(first.held_out)


def test_tokenizer_round_trips_python_source_and_has_the_special_tokens():
    corpus = load_corpus(100_000)
    tokenizer = train_tokenizer(corpus.train, 300)
    text = corpus.held_out[0][:500]
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    assert tokenizer.get_vocab_size() == 300 and tokenizer.token_to_id(MASK) is not None


def test_schedule_warms_up_then_decays_to_a_tenth():
    s = Schedule(steps=100, batch=1, seq_len=1, lr=1.0, warmup=10)
    assert s.lr_at(0) == pytest.approx(0.1) and s.lr_at(9) == pytest.approx(1.0)
    assert s.lr_at(10) == pytest.approx(1.0) and s.lr_at(100) == pytest.approx(0.1)
    assert [default_gamma(b) for b in (16, 10, 8)] == [7.0, 5.0, 4.0]


def test_block_mask_shows_context_before_the_anchor_and_the_own_block_only():
    mask = _block_mask(torch.tensor([[2, 4]]), context=5, bs=2)[0]  # [M*bs, T + M*bs]
    assert mask[:2, :5].tolist() == [[True, True, False, False, False]] * 2
    assert mask[2:, :5].tolist() == [[True, True, True, True, False]] * 2
    assert mask[:, 5:].tolist() == [[True, True, False, False], [True, True, False, False],
                                    [False, False, True, True], [False, False, True, True]]


@torch.inference_mode()
def test_training_forward_drafts_exactly_what_inference_drafts():
    """Several anchors per sequence in one pass == one proposer call per anchor."""
    target, drafter = make_target(), make_drafter()
    taps = drafter.config.target_layer_ids
    tokens = torch.tensor([[5, 3, 9, 1, 7, 2, 8, 4, 6, 11, 12, 13, 14, 15, 16]])
    _, feats = target(tokens, Step.causal(torch.zeros(1, dtype=torch.long), 15, 0), None, taps)
    anchors = torch.tensor([[3, 6, 9]])
    positions = anchors[..., None] + torch.arange(BLOCK)  # [1, 3, bs]
    block = torch.full_like(positions, drafter.config.mask_token_id)
    block[..., 0] = tokens.gather(1, anchors)
    hidden = draft_blocks(drafter, target.embed(block.flatten(1)), feats, anchors,
                          positions.flatten(1)).unflatten(1, (3, BLOCK))
    for m, anchor in enumerate(anchors[0].tolist()):
        proposer = DFlashProposer(drafter, target)
        proposer.begin(1, 32)
        draft = DraftInput(feats[:, :anchor], torch.arange(anchor)[None],
                           tokens[:, anchor], torch.tensor([anchor]), anchor, BLOCK)
        torch.testing.assert_close(target.logits(hidden[:, m, 1:]), proposer.propose(draft),
                                   atol=1e-4, rtol=1e-4)


def test_block_loss_trains_only_the_drafter():
    target, drafter = make_target(), make_drafter()
    tokens = torch.randint(0, 40, (2, 20))
    feats = target(tokens, Step.causal(torch.zeros(2, dtype=torch.long), 20, 0), None,
                   drafter.config.target_layer_ids)[1].detach()
    data = DraftData(tokens, feats, prompt_len=8)
    target.requires_grad_(False)
    loss = block_loss(drafter, target, data, torch.tensor([0, 1]), torch.tensor([[8, 10]] * 2),
                      gamma=4.0)
    loss.backward()
    assert torch.isfinite(loss) and drafter.fc.weight.grad.abs().sum() > 0
    assert target.model.embed_tokens.weight.grad is None


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("pair")
    return out, build_pair(out, TINY)


def test_a_tiny_build_writes_the_public_layouts_and_a_manifest(tiny_pair):
    out, manifest = tiny_pair
    assert is_complete(out)
    target = load_target(out / "target")
    drafter = load_drafter(out / "drafter", target.config)
    assert drafter.config.block_size == 4 and drafter.config.target_layer_ids == [0, 1]
    assert not any(k.startswith(("model.", "embed", "lm_head"))
                   for k in load_file(str(out / "drafter" / "model.safetensors")))
    saved = json.loads((out / "manifest.json").read_text())
    assert saved["recipe"]["seed"] == 0 and set(saved["acceptance"]) == {
        "dflash_b4", "ddtree_b4_budget32"}
    assert saved["target_loss"]["last10"] < saved["target_loss"]["first"]
    assert saved["drafter_loss"]["last10"] < saved["drafter_loss"]["first"]
    assert len(json.loads((out / "heldout_prompts.json").read_text())) == 4


def test_the_build_is_reproducible(tiny_pair, tmp_path):
    out, _ = tiny_pair
    build_pair(tmp_path, TINY)
    for part in ("target/model.safetensors", "drafter/model.safetensors",
                 "target/tokenizer.json", "heldout_prompts.json"):
        assert (tmp_path / part).read_bytes() == (out / part).read_bytes(), part


def test_ensure_pair_builds_only_what_is_missing(tiny_pair, tmp_path):
    out, _ = tiny_pair
    stamp = (out / "target" / "model.safetensors").stat().st_mtime_ns
    assert ensure_pair(out, TINY) == out
    assert (out / "target" / "model.safetensors").stat().st_mtime_ns == stamp
    assert is_complete(ensure_pair(tmp_path / "fresh", TINY))
