"""The one engine builder: what it refuses before it allocates, for every path that builds an
engine (the in-process backend, `serve`, `generate`), and how an engine's failure is classed."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from backends import Deployment, FailureClass, LaunchParams, Workload, get_backend
from backends.engine_builder import Checkpoints, EngineRuntime, open_engine
from backends.engine_limits import WontFit
from backends.errors import UserError
from backends.flags import LaunchTarget
from backends.inprocess import failure_of
from backends.launch_params import InvalidParams
from dflash_core.training.pair import ensure_pair

PAIR = ensure_pair()
HUGE_TREE = LaunchParams(tp_size=1, cuda_graph=False, speculative_algorithm="ddtree",
                         speculative_ddtree_budget=100_000)


def _never_loaded():
    pytest.fail("a refused launch must not load the models")


def test_a_tree_past_the_cap_is_refused_before_anything_is_loaded():
    with pytest.raises(InvalidParams, match="speculative_ddtree_budget 100000 is past the "
                                            "largest tree"):
        with open_engine(HUGE_TREE, Checkpoints(PAIR / "target", PAIR / "drafter"),
                         EngineRuntime(), max_context=64, models=_never_loaded):
            pass


def test_an_engine_that_cannot_fit_names_what_to_lower():
    launch = LaunchParams(tp_size=1, cuda_graph=False, max_running_requests=10**9)
    with pytest.raises(WontFit, match="GB are free: lower the running requests"):
        with open_engine(launch, Checkpoints(PAIR / "target"), EngineRuntime(),
                         max_context=64, models=_never_loaded):
            pass


def test_a_block_past_the_drafters_is_refused_with_both_numbers():
    launch = LaunchParams(tp_size=1, speculative_algorithm="dflash",
                          speculative_dflash_block_size=16)
    with pytest.raises(InvalidParams, match="=16 is past the drafter's trained block, 8"):
        with open_engine(launch, Checkpoints(PAIR / "target", PAIR / "drafter"),
                         EngineRuntime(), max_context=64, models=_never_loaded):
            pass


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has a GPU per rank")
def test_more_ranks_than_gpus_are_a_launch_to_change_not_a_crash():
    launch = LaunchParams(tp_size=2, cuda_graph=False)
    with pytest.raises(InvalidParams, match="2 ranks on CUDA need 2 GPUs"):
        with open_engine(launch, Checkpoints(PAIR / "target"), EngineRuntime(device="cuda"),
                         max_context=64, models=_never_loaded):
            pass


def test_the_in_process_backend_reports_the_refusal_as_its_failure_class():
    backend = get_backend("inprocess", Deployment(
        gpu="cpu", gpus=1, model=str(PAIR / "target" / "config.json"), engine="dflash",
        target=LaunchTarget(str(PAIR / "target"), str(PAIR / "drafter"))))
    [row] = backend.measure(HUGE_TREE, Workload(16, 8, (1,)))
    assert row.failure is FailureClass.INVALID_CONFIG
    assert "InvalidParams: speculative_ddtree_budget 100000 is past" in row.log_excerpt


def test_serve_refuses_a_tree_that_cannot_be_verified_in_one_line():
    run = subprocess.run(
        [sys.executable, "-m", "tuner", "serve", "--target", str(PAIR / "target"),
         "--drafter", str(PAIR / "drafter"), "--speculative-algorithm", "ddtree",
         "--budget", "100000", "--port", "0"],
        capture_output=True, text=True, timeout=120)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode == 2, run.stderr
    assert len(errors) == 1 and "is past the largest tree the engine verifies" in errors[0]


@pytest.mark.parametrize("error, failure", [
    (InvalidParams("x"), FailureClass.INVALID_CONFIG),
    (UserError("x"), FailureClass.INVALID_CONFIG),
    (WontFit("x"), FailureClass.OOM),
    (MemoryError(), FailureClass.OOM),
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate"),
     FailureClass.OOM),
    # An engine bug, even one whose message reads like a configuration error, is a crash.
    (ValueError("block_size must be >= 2"), FailureClass.CRASH),
    (IndexError("index 9 is out of bounds"), FailureClass.CRASH),
])
def test_an_engine_failure_is_classed_by_its_type_not_its_text(error, failure):
    assert failure_of(error) is failure


def test_an_unexpected_engine_error_is_a_crash_that_keeps_its_type(monkeypatch):
    import backends.inprocess

    def broken(*args, **kwargs):
        raise KeyError("verify_tokens")  # a bug inside the engine

    monkeypatch.setattr(backends.inprocess, "open_engine", broken)
    backend = get_backend("inprocess", Deployment(
        gpu="cpu", gpus=1, model=str(PAIR / "target" / "config.json"), engine="dflash",
        target=LaunchTarget(str(PAIR / "target"), str(PAIR / "drafter"))))
    [row] = backend.measure(LaunchParams(tp_size=1, cuda_graph=False), Workload(16, 8, (1,)))
    assert row.failure is FailureClass.CRASH and row.log_excerpt.startswith("KeyError:")
