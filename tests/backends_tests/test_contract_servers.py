"""The backend contract against the server backends, each launching a real child process per
configuration: `dflash-tune serve` with the shipped tiny pair, and SGLang / vLLM played by
fake_servers/fake_engine.py, which parses the argv their dialects render and serves the OpenAI
stub with that engine's metrics. A launch costs seconds, so workloads are tiny and each backend
has one good configuration."""

from __future__ import annotations

from dataclasses import replace

import psutil
import pytest
from contract import BackendContract

from backends import Deployment, LaunchParams, Workload, get_backend
from backends.flags import LaunchTarget
from fake_servers.fake_backends import FakeSGLangBackend, FakeVLLMBackend

# Two users at most, a handful of short requests: every launch measures in well under a second.
TINY = Workload(input_len=16, output_len=8, concurrency=(1, 2))
WINDOW = {"requests_per_level": 4, "warmup_requests": 1, "start_timeout_s": 60.0}


@pytest.fixture(autouse=True)
def no_server_left_behind():
    yield
    live = [p for p in psutil.Process().children(recursive=True) if p.status() != "zombie"]
    assert live == []


# --- dflash-tune serve ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def serve_backend():
    from dflash_core.training.pair import ensure_pair

    pair = ensure_pair()
    target = LaunchTarget(str(pair / "target"), str(pair / "drafter"), context_length=128)
    deployment = Deployment(gpu="cpu", gpus=1, model=str(pair / "target" / "config.json"),
                            target=target, engine="dflash")
    return get_backend("serve", deployment, **WINDOW)


SERVE_DFLASH = {"tp_size": 1, "cuda_graph": False, "max_running_requests": 4,
                "speculative_algorithm": "dflash"}


class TestServeBackendContract(BackendContract):
    """Our own server on the CPU, with the tiny trained pair (a block-8 drafter)."""

    @pytest.fixture
    def backend(self, serve_backend):
        return serve_backend

    @pytest.fixture
    def workload(self):
        return TINY

    @pytest.fixture
    def good_params(self):
        return LaunchParams(**SERVE_DFLASH)

    @pytest.fixture
    def bad_params(self):
        return {"block above the drafter's": LaunchParams(
            **{**SERVE_DFLASH, "speculative_dflash_block_size": 16})}

    @pytest.fixture
    def oom_params(self):
        return LaunchParams(**{**SERVE_DFLASH, "max_running_requests": 10**9})  # petabytes of KV


# --- SGLang and vLLM, played by the fake engine ------------------------------------------------


# Two GPUs, so that per-GPU throughput is not per-GPU by accident.
FAKE_NODE = Deployment(gpu="fake", gpus=2, model="/models/target",
                       target=LaunchTarget("/models/target", "/models/drafter"))
FAKE_DFLASH = {"tp_size": 2, "speculative_algorithm": "dflash",
               "speculative_dflash_block_size": 8, "max_running_requests": 8}


class FakeEngineContract(BackendContract):
    """A fake engine on a 2-GPU node: TP2 DFlash fits, TP4 asks for GPUs the node does not have,
    a memory fraction of 0.99 runs out of memory."""

    backend_class: type
    engine_knobs: dict = {}  # what this engine needs beside FAKE_DFLASH

    @pytest.fixture
    def backend(self):
        return self.backend_class(FAKE_NODE, **WINDOW)

    @pytest.fixture
    def workload(self):
        return TINY

    @pytest.fixture
    def good_params(self):
        return LaunchParams(**FAKE_DFLASH, **self.engine_knobs)

    @pytest.fixture
    def bad_params(self, good_params):
        return {"more GPUs than the node has": replace(good_params, tp_size=4)}

    @pytest.fixture
    def oom_params(self, good_params):
        return replace(good_params, mem_fraction_static=0.99)

    def test_speculative_rows_carry_the_engines_own_acceptance(self, backend, good_params):
        rows = backend.measure(good_params, TINY)
        # The stub commits 3 tokens per round; 8 tokens per request are rounds of 3, 3, 2.
        assert [m.accept_len_mean for m in rows] == pytest.approx([8 / 3] * len(rows))

    def test_the_fake_engine_refuses_for_the_reason_given(self, backend, bad_params,
                                                          oom_params):
        """Not an argparse error for a flag the fake does not know, which classifies alike."""
        wide = backend.measure(bad_params["more GPUs than the node has"], TINY)[0]
        assert "spans 4 GPUs but only 2 are available" in wide.log_excerpt
        assert "mem fraction 0.99" in backend.measure(oom_params, TINY)[0].log_excerpt


class TestFakeSGLangBackendContract(FakeEngineContract):
    backend_class = FakeSGLangBackend


class TestFakeVLLMBackendContract(FakeEngineContract):
    backend_class = FakeVLLMBackend
    engine_knobs = {"cudagraph_mode": "PIECEWISE"}  # vLLM refuses FULL graphs with DFlash
