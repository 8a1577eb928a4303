"""What a CUDA graph needs from a round, checked on CPU: no host read and no tensor made from a
Python list inside it, and the same storage every round; on a GPU, graph replays emit the eager
tokens."""

from __future__ import annotations

import gc

import pytest
import torch
from core_helpers import PROMPTS, VOCAB, host_sync_ops, make_drafter, make_target

from dflash_core import (
    AcceptanceProfile,
    Engine,
    EngineConfig,
    OracleProposer,
    SamplingParams,
    Spec,
)
from dflash_core.runtime.graphs import collection_paused
from dflash_core.speculation.proposer import DFlashProposer

SPECS = [Spec.none(), Spec.dflash(6), Spec.ddtree(6, 12)]
IDS = ["plain", "dflash", "ddtree"]
TOKENS = 20


def _engine(target, proposer, **config) -> Engine:
    return Engine(target, proposer, EngineConfig(max_batch=4, max_context=160,
                                                 max_tree_nodes=16, **config))


def _oracle(target, prompts, continuations) -> OracleProposer:
    return OracleProposer([p + c for p, c in zip(prompts, continuations)], VOCAB, 6,
                          AcceptanceProfile.constant(5, 0.7, 0.2))


def _state_storage(batch) -> list[int]:
    state = batch.state
    return [t.data_ptr() for t in (state.anchors, state.starts, state.features,
                                   state.feature_positions, state.packet,
                                   state.sampling.temperature, state.sampling.top_k)]


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@pytest.mark.parametrize("sampling", [SamplingParams(max_tokens=TOKENS),
                                      SamplingParams(temperature=0.8, top_k=5, top_p=0.9,
                                                     max_tokens=TOKENS)],
                         ids=["greedy", "filtered"])
@torch.inference_mode()
def test_a_round_reads_nothing_back_and_makes_no_tensor_from_lists(spec, moe, sampling, fused):
    target = make_target(moe)
    engine = _engine(target, DFlashProposer(make_drafter(), target), fused_attention=fused)
    batch = engine.open_batch(spec)
    batch.admit(PROMPTS[:3], [sampling] * 3)
    batch.step()  # a first round, so the drafter context of every row is in place
    n, read_len = 3, max(batch.starts_h)
    batch.state.starts[:n].copy_(torch.tensor(batch.starts_h[:n]))
    mode = batch.state.sampling.mode(n)
    assert host_sync_ops(lambda: batch.round.run(n, read_len, mode, False)) == set()


@pytest.mark.parametrize("spec", SPECS[1:], ids=IDS[1:])
@torch.inference_mode()
def test_the_oracle_proposer_round_reads_nothing_back_either(spec):
    target = make_target()
    plain = _engine(target, None).generate(PROMPTS[:2], SamplingParams(max_tokens=30))
    engine = _engine(target, _oracle(target, PROMPTS[:2], plain.tokens))
    batch = engine.open_batch(spec)
    batch.admit(PROMPTS[:2], [SamplingParams(max_tokens=TOKENS)] * 2)
    batch.step()
    assert host_sync_ops(lambda: batch.round.run(2, max(batch.starts_h), "greedy", False)) \
        == set()


@torch.inference_mode()
def test_rounds_keep_their_storage_across_rounds_and_generate_calls():
    target = make_target()
    engine = _engine(target, DFlashProposer(make_drafter(), target))
    spec, greedy = Spec.ddtree(6, 12), SamplingParams(max_tokens=TOKENS)
    batch = engine.open_batch(spec, rows=3)
    before = _state_storage(batch)
    first = engine.generate(PROMPTS[:3], greedy, spec)
    assert engine.open_batch(spec, rows=3).round is batch.round  # kept, with its graphs
    assert _state_storage(batch) == before
    again = engine.generate(PROMPTS[:3], greedy, spec)
    assert again.tokens == first.tokens  # a reused round starts clean


def test_cuda_graphs_need_a_cuda_device():
    with pytest.raises(ValueError, match="CUDA"):
        _engine(make_target(), None, cuda_graphs=True)
    with pytest.raises(ValueError, match="neither CUDA graphs nor compile"):
        _engine(make_target(), None).open_batch(Spec.none()).capture()
    config = EngineConfig(cuda_graphs=True)
    assert config.context_bucket > 0  # a graph per exact prefix length would never replay


def test_captures_pause_the_cycle_collector_and_restore_it_as_found():
    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError):
        with collection_paused():
            assert not gc.isenabled()
            1 / 0
    assert gc.isenabled()
    gc.disable()
    try:
        with collection_paused():
            pass
        assert not gc.isenabled()  # a caller's own pause outlives ours
    finally:
        gc.enable()


@pytest.mark.gpu
@torch.inference_mode()
def test_no_cycle_collection_runs_inside_a_capture():
    # One would free whatever unreachable engine's graphs it finds, and destroying a graph
    # during another capture invalidates that capture.
    target = make_target().cuda()
    spec, greedy = Spec.dflash(6), SamplingParams(max_tokens=TOKENS)
    plain = _engine(target, None).generate(PROMPTS[:2], SamplingParams(max_tokens=40))
    engine = _engine(target, _oracle(target, PROMPTS[:2], plain.tokens), cuda_graphs=True)
    capturing = []

    def on_collection(phase, _info) -> None:
        if phase == "start":
            capturing.append(torch.cuda.is_current_stream_capturing())

    threshold = gc.get_threshold()
    gc.callbacks.append(on_collection)
    gc.set_threshold(1)  # a young-generation collection at almost every allocation
    try:
        graphed = engine.generate(PROMPTS[:2], greedy, spec)
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(on_collection)
    assert engine.open_batch(spec, rows=2).round.graphs.captures > 0
    assert capturing and not any(capturing)  # collections ran, none of them in a capture
    assert graphed.tokens == [tokens[:TOKENS] for tokens in plain.tokens]  # lossless, greedy


@pytest.mark.gpu
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@torch.inference_mode()
def test_graph_replays_emit_the_eager_tokens(spec, moe):
    target, drafter = make_target(moe).cuda(), make_drafter().cuda()
    greedy = SamplingParams(max_tokens=TOKENS)
    eager = _engine(target, DFlashProposer(drafter, target), batch_buckets=(4,),
                    context_bucket=32).generate(PROMPTS[:3], greedy, spec)
    engine = _engine(target, DFlashProposer(drafter, target), batch_buckets=(4,),
                     context_bucket=32, cuda_graphs=True)
    graphed = engine.generate(PROMPTS[:3], greedy, spec)
    assert graphed.tokens == eager.tokens
    again = engine.generate(PROMPTS[:3], greedy, spec)  # every shape replays now
    assert again.tokens == eager.tokens
    graphs = engine.open_batch(spec, rows=3).round.graphs
    assert graphs.replays >= again.stats.rounds and graphs.captures == len(graphs.graphs)


@pytest.mark.gpu
@torch.inference_mode()
def test_graph_replays_with_the_oracle_and_sampling_rows_stay_lossless_for_greedy_rows():
    target = make_target().cuda()
    greedy = SamplingParams(max_tokens=TOKENS)
    plain = _engine(target, None).generate(PROMPTS[:2], SamplingParams(max_tokens=40))
    engine = _engine(target, _oracle(target, PROMPTS[:2], plain.tokens), cuda_graphs=True)
    spec = Spec.ddtree(6, 12)
    batch = engine.open_batch(spec, rows=2)
    hot = SamplingParams(temperature=0.9, top_p=0.8, max_tokens=TOKENS)
    batch.admit(PROMPTS[:2], [greedy, hot])  # the greedy row shares a graph with a sampling one
    while batch.live_rows():
        batch.step()
    assert batch.requests[0].output == plain.tokens[0][:TOKENS]
    assert batch.round.graphs.replays > 0


@pytest.mark.gpu
@torch.inference_mode()
def test_graphs_captured_up_front_serve_every_later_round():
    target = make_target().cuda()
    drafter = make_drafter().cuda()
    engine = _engine(target, DFlashProposer(drafter, target), batch_buckets=(1, 2, 4),
                     context_bucket=32, cuda_graphs=True)
    spec, greedy = Spec.ddtree(6, 12), SamplingParams(max_tokens=TOKENS)
    batch = engine.open_batch(spec)
    made = batch.capture()
    assert made == len(engine.config.batch_buckets) * len(
        batch.shapes.all_read_lens(160, batch.cache.capacity))
    with pytest.raises(RuntimeError):
        batch.admit(PROMPTS[:1], [greedy])
        batch.capture()
    while batch.live_rows():
        batch.step()
    assert batch.round.graphs.captures == made  # every round replayed a graph made up front
    eager = _engine(target, DFlashProposer(drafter, target)).generate(PROMPTS[:1], greedy, spec)
    assert batch.requests[0].output == eager.tokens[0]
