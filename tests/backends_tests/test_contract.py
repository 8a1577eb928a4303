"""Run the backend contract against every backend that runs on CPU."""

from __future__ import annotations

import pytest
from contract import BackendContract

from backends import LaunchParams as LP
from backends import Workload, get_backend

DFLASH = {"ep_size": 8, "speculative_algorithm": "dflash", "speculative_dflash_block_size": 8}


class TestModelBackendContract(BackendContract):
    """The performance model, on the user's node (8x RTX PRO 6000, Kimi K2.6, block-8 drafter)."""

    @pytest.fixture
    def backend(self, pcie8_reference):
        return get_backend("model", pcie8_reference.deployment)

    @pytest.fixture
    def workload(self):
        # 256 is past the KV pool's ~149 requests, so the queueing branch is covered too.
        return Workload(input_len=1024, output_len=512, concurrency=(1, 4, 64, 256))

    @pytest.fixture(params=["tp8", "ep8_dflash_eager", "ep8_ddtree"])
    def good_params(self, request):
        return {
            "tp8": LP(max_running_requests=256, cuda_graph_max_bs=256),
            "ep8_dflash_eager": LP(**DFLASH, cuda_graph=False),
            "ep8_ddtree": LP(**{**DFLASH, "speculative_algorithm": "ddtree"},
                             speculative_ddtree_budget=16, speculative_ddtree_topk=2),
        }[request.param]

    @pytest.fixture
    def bad_params(self):
        return {
            "gpus mismatch": LP(tp_size=4, dp_size=1),
            "block above the drafter's": LP(**{**DFLASH, "speculative_dflash_block_size": 16}),
        }

    @pytest.fixture
    def oom_params(self):
        return LP(tp_size=4, dp_size=2)  # two replicas of ~594 GB on 96 GB cards


class TestSimulatedBackendContract(TestModelBackendContract):
    """The same node and configurations, measured noisily around the model (its hidden truth);
    no launch cost, so only the noise differs from the model's contract run."""

    @pytest.fixture
    def backend(self, pcie8_reference):
        from backends.simulated import Simulation

        return get_backend("simulated", pcie8_reference.deployment,
                           simulation=Simulation(noise=0.1, launch_s=0.0))


def _pair_deployment():
    from backends import Deployment
    from backends.flags import LaunchTarget
    from dflash_core.training.pair import ensure_pair

    pair = ensure_pair()
    target = LaunchTarget(str(pair / "target"), str(pair / "drafter"))
    return Deployment(gpu="cpu", gpus=1, model=str(pair / "target" / "config.json"),
                      target=target, engine="dflash")


@pytest.fixture(scope="module")
def inprocess_backend():
    """Loads the pair once for every contract test."""
    return get_backend("inprocess", _pair_deployment(), requests_per_level=6)


TINY_GOOD = {"tp_size": 1, "cuda_graph": False, "max_running_requests": 4}
TINY_SPECS = {"plain": {}, "dflash": {"speculative_algorithm": "dflash"},
              "ddtree": {"speculative_algorithm": "ddtree", "speculative_ddtree_budget": 16,
                         "speculative_ddtree_topk": 4}}


class TestInProcessBackendContract(BackendContract):
    """dflash_core in this process, with the shipped tiny trained pair, on the CPU."""

    @pytest.fixture
    def backend(self, inprocess_backend):
        return inprocess_backend

    @pytest.fixture
    def workload(self):
        return Workload(input_len=32, output_len=12, concurrency=(1, 4))

    @pytest.fixture(params=["plain", "dflash", "ddtree"])
    def good_params(self, request):
        return LP(**TINY_GOOD, **TINY_SPECS[request.param])

    @pytest.fixture
    def bad_params(self):
        return {"block above the drafter's": LP(**TINY_GOOD, speculative_algorithm="dflash",
                                                 speculative_dflash_block_size=16)}

    @pytest.fixture
    def oom_params(self):
        return LP(**{**TINY_GOOD, "max_running_requests": 10**9})  # a KV cache of petabytes


def test_in_process_greedy_probe_of_speculative_configs_equals_the_baseline(inprocess_backend):
    """The losslessness gate's evidence, from real engines: DFlash and DDTree launches answer
    the probe with exactly the baseline's greedy tokens."""
    from tuner.config import GatesConfig
    from tuner.launches.gates import Gates

    workload = Workload(input_len=32, output_len=12, concurrency=(1,))
    prompts = [[100 + 7 * i + j for j in range(24)] for i in range(6)]
    gates = Gates(GatesConfig(probe_prompts=6, probe_tokens=10, soak_s=0.0), prompts, 12)
    with inprocess_backend.session(LP(**TINY_GOOD), workload) as baseline:
        gates.record_reference(baseline)
    assert len(gates.reference) == 6 and all(len(t.split()) == 10 for t in gates.reference)
    for spec in ({"speculative_algorithm": "dflash"},
                 {"speculative_algorithm": "ddtree", "speculative_ddtree_budget": 16}):
        params = LP(**TINY_GOOD, **spec)
        with inprocess_backend.session(params, workload) as session:
            best = session.measure(1)
            assert gates(session, params, best) is None
            assert best.accept_len_mean > 1.1


@pytest.mark.slow
def test_in_process_tp2_launch_answers_the_probe_with_the_tp1_baseline(inprocess_backend):
    """tp_size reaches the engine: a TP2 launch (two CPU ranks) is measured, and its greedy probe
    gives the single-device baseline's tokens."""
    from tuner.config import GatesConfig
    from tuner.launches.gates import Gates

    workload = Workload(input_len=32, output_len=12, concurrency=(1,))
    prompts = [[100 + 7 * i + j for j in range(24)] for i in range(4)]
    gates = Gates(GatesConfig(probe_prompts=4, probe_tokens=10, soak_s=0.0), prompts, 12)
    with inprocess_backend.session(LP(**TINY_GOOD), workload) as baseline:
        gates.record_reference(baseline)
    params = LP(**{**TINY_GOOD, "tp_size": 2}, speculative_algorithm="dflash")
    with inprocess_backend.session(params, workload) as session:
        assert session.engine.target.comm.world == 2
        best = session.measure(1)
        assert gates(session, params, best) is None
        assert best.ok and best.accept_len_mean > 1.1
