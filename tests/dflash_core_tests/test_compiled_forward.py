"""The verify forward through torch.compile gives the eager engine's tokens (EngineConfig.compile).

"eager" runs Dynamo's trace without code generation (~30 s on 2 shared cores); "inductor"
generates C++ (minutes): both are marked slow.
"""

from __future__ import annotations

import pytest
import torch
from core_helpers import BLOCK, PROMPTS, make_drafter, make_target

from dflash_core import DFlashProposer, Engine, EngineConfig, SamplingParams, Spec
from dflash_core.models.step import Step
from dflash_core.runtime.compiled import CompiledForward
from dflash_core.runtime.engine import DEFAULT_GRAPH_CONTEXT_BUCKET

GREEDY = SamplingParams(max_tokens=10)
SPEC = Spec.ddtree(BLOCK, 8, topk=2)  # the tree mask: the case a chain would not exercise


def _engine(compile_backend: str) -> Engine:
    target = make_target()
    return Engine(target, DFlashProposer(make_drafter(), target),
                  EngineConfig(max_batch=4, max_context=96, max_tree_nodes=16,
                               compile=compile_backend))


def _tokens(engine: Engine) -> list:
    return [engine.generate(p, GREEDY, SPEC).tokens for p in (PROMPTS, PROMPTS[:1])]


def _check_compiled_equals_eager(backend: str) -> None:
    compiled = _engine(backend)
    assert _tokens(compiled) == _tokens(_engine("none"))
    verify, draft, stages = compiled.compiled_graphs()
    assert verify.compiles >= 2 and verify.warmup_s > 0 and draft.compiles >= 2
    assert stages.compiles >= 2  # a DDTree build per shape
    assert all(r.forward is compiled.compiled for r in compiled._rounds.values())


@pytest.mark.slow  # ~30 s of Dynamo tracing on 2 cores
def test_dynamo_traced_verify_gives_eager_tokens():
    _check_compiled_equals_eager("eager")


@pytest.mark.slow
def test_inductor_verify_gives_eager_tokens():
    _check_compiled_equals_eager("inductor")


def test_compile_refuses_an_unknown_backend_and_cuda_graphs():
    with pytest.raises(ValueError, match="compile must be one of"):
        EngineConfig(compile="tensorrt")
    with pytest.raises(ValueError, match="exclusive"):
        EngineConfig(compile="inductor", cuda_graphs=True)


def test_compiled_forward_writes_the_cache_as_eager_does_one_graph_per_shape():
    """The graph returns the cache writes and they run after it (compiled.py): the cache and the
    outputs must still be eager's, bit for bit (Dynamo trace, no Inductor: seconds)."""
    target = make_target()
    taps = (0, 2)
    compiled = CompiledForward(target, taps, "eager")
    starts = torch.tensor([9, 4, 7])
    ids = torch.tensor([[5, 6], [7, 8], [9, 10]])
    with torch.inference_mode():
        caches = [target.allocate_cache(4, 32) for _ in range(2)]
        for cache in caches:
            torch.manual_seed(3)
            cache.k.normal_()
            cache.v.normal_()
        for read_len in (12, 12, 16):
            eager = target(ids, Step.causal(starts, 2, read_len), caches[0].row_range(3), taps)
            got = compiled(ids, Step.causal(starts, 2, read_len), caches[1].row_range(3), taps)
            assert all(torch.equal(a, b) for a, b in zip(got, eager, strict=True))
            assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
            starts = starts + 2
    assert compiled.shapes.compiles == 2  # read 12 twice (other starts, one graph), then 16
    with pytest.raises(ValueError, match="compiled for taps"):
        compiled(ids, Step.causal(starts, 2, 16), caches[1].row_range(3), [0])


def test_compile_reads_the_prefix_in_buckets_by_default():
    assert EngineConfig(compile="inductor").context_bucket == DEFAULT_GRAPH_CONTEXT_BUCKET
    assert EngineConfig(compile="inductor", context_bucket=64).context_bucket == 64
    assert EngineConfig().context_bucket == 0


@pytest.mark.slow  # nine Dynamo traces, ~12 s on 2 cores
def test_compiled_shapes_past_dynamos_recompile_limit_stay_compiled():
    """Each shape's graph has a code object of its own: nine shapes, in nine CompiledForwards
    as nine engines would make, must each be compiled, not sent back to eager at Dynamo's
    limit of 8 (the backend here counts the graphs Dynamo hands it)."""
    target = make_target()
    calls = []

    def counting_backend(graph, example_inputs):
        calls.append(len(example_inputs))
        return graph.forward

    with torch.inference_mode():
        cache = target.allocate_cache(2, 40)
        for read_len in range(4, 13):
            compiled = CompiledForward(target, (), "eager")
            compiled.shapes.backend = counting_backend
            starts = torch.tensor([read_len, read_len - 1])
            compiled(torch.tensor([[3], [4]]), Step.causal(starts, 1, read_len),
                     cache.row_range(2), ())
    assert len(calls) == 9


@pytest.mark.slow  # six Dynamo traces, ~10 s on 2 cores
def test_capture_compiles_every_round_shape_before_a_request_and_serving_compiles_none():
    """`LiveBatch.capture` with compile on is what it is with CUDA graphs: every (rows bucket,
    read bucket) shape of the verify and the drafter's block pass, and every prompt bucket's
    prefill, is compiled before the first request, so the requests after it compile nothing
    and get eager's tokens, for DFlash and for plain decoding (no draft: a tree of the root
    alone)."""
    target, drafter = make_target(), make_drafter()
    config = dict(max_batch=2, max_context=40, max_tree_nodes=16, batch_buckets=(1, 2))
    compiled = Engine(target, DFlashProposer(drafter, target),
                      EngineConfig(**config, compile="eager"))
    eager = Engine(target, DFlashProposer(drafter, target), EngineConfig(**config))
    verify, draft, stages = compiled.compiled_graphs()
    with torch.inference_mode():
        # rows 2 and 1, one read: a verify and a block pass for each (chains build eagerly);
        # prompts of up to 39 tokens padded to 16, 32 or 56 (the cache): 3 prefills
        assert compiled.open_batch(Spec.dflash(BLOCK)).capture() == 4 + 3
        assert compiled.open_batch(Spec.none()).capture() == 2  # no block pass, same prefills
    counts = (verify.compiles, draft.compiles, stages.compiles)
    assert counts == (4 + 3, 2, 0)
    for spec in (Spec.dflash(BLOCK), Spec.none()):
        for prompts in (PROMPTS[:2], PROMPTS[:1]):
            assert compiled.generate(prompts, GREEDY, spec).tokens == \
                eager.generate(prompts, GREEDY, spec).tokens
    assert (verify.compiles, draft.compiles, stages.compiles) == counts
    with pytest.raises(ValueError, match="neither CUDA graphs nor compile"):
        eager.open_batch(Spec.none()).capture()
