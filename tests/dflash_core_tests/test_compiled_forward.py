"""The verify forward through torch.compile gives the eager engine's tokens (EngineConfig.compile).

"eager" runs Dynamo's trace without code generation (~30 s on 2 shared cores); "inductor"
generates C++ (minutes): both are marked slow.
"""

from __future__ import annotations

import pytest
from core_helpers import BLOCK, PROMPTS, make_drafter, make_target

from dflash_core import DFlashProposer, Engine, EngineConfig, SamplingParams, Spec

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
    assert compiled.compiled.compiles >= 2 and compiled.compiled.warmup_s > 0
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
