"""Fixed round shapes (batch buckets, context buckets: what CUDA graphs will replay) and fused
attention kernels change no token: padded rows and padded prefix reads are invisible to the
live requests."""

from __future__ import annotations

import pytest
import torch
from core_helpers import PROMPTS, make_drafter, make_target

from dflash_core import Engine, EngineConfig, SamplingParams, Spec
from dflash_core.runtime.shapes import RoundShapes
from dflash_core.speculation.proposer import DFlashProposer
from dflash_core.training.evaluate import held_out_prompts, load_pair
from dflash_core.training.pair import ensure_pair

TOKENS = 20
SPECS = [Spec.none(), Spec.dflash(6), Spec.ddtree(6, 12)]


def test_rows_round_up_to_the_smallest_fitting_bucket_within_the_batch():
    shapes = RoundShapes((1, 2, 4, 8))
    assert [shapes.rows(n, 8) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    assert shapes.rows(3, 3) == 3  # no bucket fits inside the batch: all its rows
    assert RoundShapes().rows(3, 8) == 3  # no buckets: exactly the rows needed


def test_prefix_reads_round_up_to_the_context_bucket_within_the_cache():
    shapes = RoundShapes(context_bucket=64)
    assert [shapes.read_len(n, 200) for n in (0, 1, 64, 65, 190)] == [0, 64, 64, 128, 192]
    assert shapes.read_len(199, 200) == 200  # never past the cache
    assert RoundShapes().read_len(65, 200) == 65
    with pytest.raises(ValueError):
        RoundShapes((0,))


def test_prefix_reads_below_the_context_bucket_round_up_to_a_power_of_two():
    """A masked slot costs what a read one does: a short context does not read a whole
    256-slot bucket. From the bucket on, reads step by it (bounded waste at long contexts)."""
    shapes = RoundShapes(context_bucket=256)
    lens = [shapes.read_len(n, 1100) for n in (1, 64, 65, 128, 129, 256, 257, 700, 1099)]
    assert lens == [64, 64, 128, 128, 256, 256, 512, 768, 1100]
    assert shapes.all_read_lens(1024, 1100) == [1024, 768, 512, 256, 128, 64]
    assert RoundShapes(context_bucket=100).all_read_lens(300, 400) == [300, 200, 100, 64]


def test_prompts_pad_to_a_power_of_two_within_the_cache_one_bucket_per_length():
    shapes = RoundShapes(prompt_buckets=True)
    assert [shapes.prompt_len(n, 200) for n in (1, 16, 17, 64, 65, 150)] == \
        [16, 16, 32, 64, 128, 200]  # never past the cache
    assert shapes.all_prompt_lens(160, 176) == [176, 128, 64, 32, 16]
    assert shapes.all_prompt_lens(129, 200) == [128, 64, 32, 16]  # prompts of <= 128 tokens


@pytest.mark.parametrize("spec", SPECS, ids=["plain", "dflash", "ddtree"])
@torch.inference_mode()
def test_prefill_one_request_at_a_time_in_prompt_buckets_emits_the_same_tokens(spec):
    """The compiled prefill's shapes, run eagerly: each prompt alone, padded to its bucket."""
    target, drafter = make_target(), make_drafter()
    greedy = SamplingParams(max_tokens=TOKENS)
    exact = _engine(target, drafter).generate(PROMPTS[:3], greedy, spec)
    engine = _engine(target, drafter)
    batch = engine.open_batch(spec, 3)
    batch.shapes = RoundShapes(prompt_buckets=True)
    batch.admit(PROMPTS[:3], [greedy] * 3)
    while batch.live_rows():
        batch.step()
    assert [r.output for r in batch.requests] == exact.tokens


def _engine(target, drafter, **shapes) -> Engine:
    return Engine(target, DFlashProposer(drafter, target),
                  EngineConfig(max_batch=4, max_context=160, max_tree_nodes=16, **shapes))


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("spec", SPECS, ids=["plain", "dflash", "ddtree"])
@torch.inference_mode()
def test_bucketed_rounds_emit_the_exact_rounds_tokens(spec, moe):
    target, drafter = make_target(moe), make_drafter()
    greedy = SamplingParams(max_tokens=TOKENS)
    exact = _engine(target, drafter).generate(PROMPTS[:3], greedy, spec)
    padded = _engine(target, drafter, batch_buckets=(4,), context_bucket=32,
                     stage_timing=False).generate(PROMPTS[:3], greedy, spec)
    assert padded.tokens == exact.tokens
    assert padded.stats.acceptance == exact.stats.acceptance
    fused = _engine(target, drafter, fused_attention=True).generate(PROMPTS[:3], greedy, spec)
    assert fused.tokens == exact.tokens  # the fused kernels change no token either


@torch.inference_mode()
def test_a_live_batch_in_buckets_matches_solo_runs_as_requests_come_and_go():
    directory = ensure_pair()
    target, drafter = load_pair(directory)
    prompts = [p[: 20 + 9 * i] for i, p in enumerate(held_out_prompts(directory)[:4])]
    config = dict(max_batch=4, max_context=128, max_tree_nodes=17)
    solo = Engine(target, DFlashProposer(drafter, target), EngineConfig(**config))
    greedy = SamplingParams(max_tokens=TOKENS)
    spec = Spec.ddtree(8, 16)
    alone = [solo.generate([p], greedy, spec).tokens[0] for p in prompts]
    engine = Engine(target, DFlashProposer(drafter, target),
                    EngineConfig(**config, batch_buckets=(2, 4), context_bucket=128,
                                 fused_attention=True))  # reads of 64, then 128
    batch, outputs, rows = engine.open_batch(spec), {i: [] for i in range(4)}, {}
    waiting = [0, 1, 2, 3]
    while waiting or batch.live_rows():
        for row in [r for r in batch.free_rows() if batch.requests[r] is not None]:
            batch.release(row)
        joining = waiting[:1]  # one arrival per round: the live row count keeps changing
        waiting = waiting[1:]
        for event, i in zip(batch.admit([prompts[i] for i in joining], [greedy] * len(joining)),
                            joining):
            rows[event.row] = i
            outputs[i] += event.tokens
        for event in batch.step():
            outputs[rows[event.row]] += event.tokens
    assert [outputs[i] for i in range(4)] == alone


@pytest.mark.gpu
@pytest.mark.parametrize("spec", SPECS, ids=["plain", "dflash", "ddtree"])
@torch.inference_mode()
def test_bucketed_rounds_without_stage_syncs_on_cuda_emit_the_cpu_tokens(spec):
    target, drafter = make_target(), make_drafter()
    greedy = SamplingParams(max_tokens=TOKENS)
    cpu = _engine(target, drafter).generate(PROMPTS[:3], greedy, spec)
    target, drafter = target.cuda(), drafter.cuda()
    cuda = _engine(target, drafter, batch_buckets=(4,), context_bucket=32,
                   stage_timing=False).generate(PROMPTS[:3], greedy, spec)
    assert cuda.tokens == cpu.tokens


def test_every_round_shape_is_listed_largest_first_for_capture():
    shapes = RoundShapes((1, 2, 4), context_bucket=64)
    assert shapes.all_rows(6) == [6, 4, 2, 1]  # 5 and 6 rows fit no bucket: all six rows
    assert RoundShapes().all_rows(3) == [3, 2, 1]
    assert shapes.all_read_lens(200, 216) == [216, 192, 128, 64]
    every = {shapes.read_len(n, 216) for n in range(1, 200)}
    assert set(shapes.all_read_lens(200, 216)) == every
    with pytest.raises(ValueError, match="context_bucket"):
        RoundShapes().all_read_lens(200, 216)
