"""The engine factory (load_models, build_engine) and the lazy package it is exported from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from core_helpers import BLOCK, PROMPTS, VOCAB, make_drafter, make_engine, make_target

from dflash_core import (
    CheckpointError,
    DFlashProposer,
    SamplingParams,
    Spec,
    build_engine,
    load_models,
    save_model,
)

REPO = Path(__file__).resolve().parents[2]
LIMITS = dict(max_batch=4, max_context=160, max_tree_nodes=16)
GREEDY = SamplingParams(max_tokens=12)


def test_the_spec_module_imports_without_torch():
    """The tuner reads METHODS and Spec where the engine extra (torch) is not installed."""
    code = ("import sys; import dflash_core.speculation.spec; "
            "from dflash_core import METHODS, Spec; "
            "assert 'torch' not in sys.modules, 'torch was imported'; print(METHODS)")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "('none', 'dflash', 'ddtree')"


def test_the_package_still_exports_the_engine():
    import dflash_core
    from dflash_core import Engine
    from dflash_core.runtime.engine import Engine as EngineClass

    assert Engine is EngineClass
    assert sorted(dflash_core.__all__) == sorted(dflash_core._MODULE_OF)
    assert set(dflash_core.__all__) <= set(dir(dflash_core))
    assert all(getattr(dflash_core, name) is not None for name in dflash_core.__all__)
    with pytest.raises(AttributeError, match="no attribute 'Engin'"):
        dflash_core.Engin  # noqa: B018


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    save_model(make_target(), root / "target")
    save_model(make_drafter(), root / "drafter")
    return root


@pytest.mark.parametrize("dtype, want", [("float32", torch.float32), ("bfloat16", torch.bfloat16),
                                         ("torch.bfloat16", torch.bfloat16),
                                         (torch.float16, torch.float16)])
def test_load_models_takes_a_dtype_or_its_name(checkpoints, dtype, want):
    target, drafter = load_models(checkpoints / "target", checkpoints / "drafter", dtype)
    assert target.lm_head.weight.dtype == want and drafter.fc.weight.dtype == want
    assert drafter.config.block_size == BLOCK


def test_load_models_without_a_drafter(checkpoints):
    target, drafter = load_models(checkpoints / "target")
    assert drafter is None and target.config.vocab_size == VOCAB


def test_load_models_refuses_an_unknown_dtype_and_a_mismatched_drafter(checkpoints, tmp_path):
    with pytest.raises(ValueError, match="unknown dtype 'float33'"):
        load_models(checkpoints / "target", dtype="float33")
    with pytest.raises(ValueError, match="unknown dtype 'Tensor'"):
        load_models(checkpoints / "target", dtype="Tensor")  # a torch attribute, not a dtype
    save_model(make_target(vocab_size=VOCAB + 8), tmp_path / "other")
    with pytest.raises(CheckpointError, match=rf"vocab_size {VOCAB} != target vocab_size "
                                              rf"{VOCAB + 8}"):
        load_models(tmp_path / "other", checkpoints / "drafter")


def test_build_engine_wraps_the_drafter_and_passes_every_option():
    target, drafter = make_target(), make_drafter()
    engine = build_engine(target, drafter, **LIMITS, batch_buckets=[2, 4], context_bucket=32,
                          fused_attention=True, stage_timing=True)
    cfg = engine.config
    assert isinstance(engine.proposer, DFlashProposer) and engine.proposer.drafter is drafter
    assert (cfg.max_batch, cfg.max_context, cfg.max_tree_nodes) == (4, 160, 16)
    assert (cfg.batch_buckets, cfg.context_bucket) == ((2, 4), 32)
    assert cfg.fused_attention and cfg.stage_timing
    assert not cfg.cuda_graphs  # buckets, but the target is on the CPU
    plain = make_engine(target).generate(PROMPTS, GREEDY)
    assert engine.generate(PROMPTS, GREEDY, Spec.ddtree(BLOCK, 8)).tokens == plain.tokens


def test_build_engine_without_a_drafter_runs_plain_decoding_only():
    engine = build_engine(make_target(), **LIMITS)
    assert engine.proposer is None and not engine.config.cuda_graphs
    with pytest.raises(ValueError, match="needs a drafter"):
        engine.generate(PROMPTS, GREEDY, Spec.dflash(BLOCK))


def test_build_engine_refuses_graphs_off_cuda_and_unknown_options():
    with pytest.raises(ValueError, match="cuda_graphs needs a CUDA device"):
        build_engine(make_target(), **LIMITS, batch_buckets=(4,), cuda_graphs=True)
    with pytest.raises(TypeError, match="stage_timings"):
        build_engine(make_target(), **LIMITS, stage_timings=True)


@pytest.mark.gpu
def test_build_engine_turns_graphs_on_for_buckets_on_cuda():
    target, drafter = make_target().cuda(), make_drafter().cuda()
    assert build_engine(target, drafter, **LIMITS, batch_buckets=(4,)).config.cuda_graphs
    assert not build_engine(target, **LIMITS).config.cuda_graphs  # no buckets: eager
    off = build_engine(target, **LIMITS, batch_buckets=(4,), cuda_graphs=False)
    assert not off.config.cuda_graphs
