"""Continuous batching: requests that join a running batch, in freed rows, next to requests
that sample, still emit exactly their plain greedy tokens."""

from __future__ import annotations

import pytest
import torch

from dflash_core import Engine, EngineConfig, SamplingParams, Spec
from dflash_core.models.step import Step
from dflash_core.speculation.proposer import DFlashProposer
from dflash_core.training.evaluate import held_out_prompts, load_pair
from dflash_core.training.pair import ensure_pair

TOKENS = 24


@pytest.fixture(scope="module")
def pair():
    directory = ensure_pair()
    target, drafter = load_pair(directory)
    prompts = [p[: 20 + 7 * i] for i, p in enumerate(held_out_prompts(directory)[:6])]
    engine = Engine(target, DFlashProposer(drafter, target),
                    EngineConfig(max_batch=3, max_context=128, max_tree_nodes=33))
    alone = [engine.generate([p], SamplingParams(max_tokens=TOKENS)).tokens[0] for p in prompts]
    return engine, prompts, alone


def _drain(batch, outputs, row_to_request):
    for event in batch.step():
        outputs[row_to_request[event.row]] += event.tokens


@pytest.mark.parametrize("spec", [Spec.none(), Spec.dflash(8), Spec.ddtree(8, 32)],
                         ids=["plain", "dflash", "ddtree"])
@torch.inference_mode()
def test_requests_joining_mid_flight_emit_their_solo_tokens(pair, spec):
    engine, prompts, alone = pair
    batch = engine.open_batch(spec)
    greedy = SamplingParams(max_tokens=TOKENS)
    outputs = {i: [] for i in range(len(prompts))}
    row_to_request, waiting = {}, list(range(len(prompts)))
    rounds = 0
    while waiting or batch.live_rows():
        for row in [r for r in batch.free_rows() if batch.requests[r] is not None]:
            batch.release(row)
        free = batch.free_rows()
        joining = waiting[: min(len(free), 1 if rounds % 2 else 2)]  # stagger the arrivals
        waiting = waiting[len(joining):]
        for event, request in zip(batch.admit([prompts[i] for i in joining],
                                              [greedy] * len(joining)), joining):
            row_to_request[event.row] = request
            outputs[request] += event.tokens
        _drain(batch, outputs, row_to_request)
        rounds += 1
    assert [outputs[i] for i in range(len(prompts))] == alone
    assert rounds < len(prompts) * TOKENS  # requests really shared rounds
    # Joining rows get their prompt as drafter context: acceptance matches a static batch's.
    static = engine.generate(prompts[:3], greedy, spec).stats.mean_acceptance
    assert batch.stats.mean_acceptance >= 0.85 * static
    assert spec.method == "none" or static > 1.5


@torch.inference_mode()
def test_greedy_rows_are_unaffected_by_sampling_neighbours(pair):
    engine, prompts, alone = pair
    batch = engine.open_batch(Spec.ddtree(8, 16), seed=3)
    hot = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=TOKENS)
    events = batch.admit(prompts[:3], [SamplingParams(max_tokens=TOKENS), hot, hot])
    outputs = {e.row: list(e.tokens) for e in events}
    while batch.live_rows():
        for e in batch.step():
            outputs[e.row] += e.tokens
    assert outputs[0] == alone[0]
    assert all(len(outputs[r]) == TOKENS for r in (1, 2))


def test_admitting_more_than_the_free_rows_is_refused(pair):
    engine, prompts, _ = pair
    batch = engine.open_batch(Spec.dflash(8))
    with pytest.raises(ValueError, match="free rows"):
        batch.admit(prompts[:4], [SamplingParams()] * 4)


@torch.inference_mode()
def test_a_joining_request_gives_the_drafter_its_whole_prompt_as_context(pair):
    engine, prompts, _ = pair
    batch = engine.open_batch(Spec.dflash(8))
    greedy = SamplingParams(max_tokens=TOKENS)
    batch.admit(prompts[:1], [greedy])
    for _ in range(3):
        batch.step()
    (event,) = batch.admit(prompts[4:5], [greedy])  # longer than anything pending
    batch.step()
    prompt = prompts[4]
    drafter, target = engine.proposer.drafter, engine.target
    fresh = drafter.allocate_cache(1, len(prompt))
    step = Step.causal(torch.zeros(1, dtype=torch.long), len(prompt), 0)
    _, feats = target(torch.tensor([prompt]), step, None, engine.taps)
    drafter.write_context(feats, torch.arange(len(prompt))[None], fresh)
    cached = engine.proposer.cache.k[:, event.row, :, : len(prompt)]
    torch.testing.assert_close(cached, fresh.k[:, 0], atol=1e-4, rtol=1e-4)
