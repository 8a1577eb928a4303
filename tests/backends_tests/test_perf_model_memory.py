"""Memory fit and KV capacity on the user's node (RTX PRO 6000: 95.6 GiB a GPU)."""

from __future__ import annotations

import pytest

from backends.contract import FailureClass, Workload
from backends.launch_params import LaunchParams
from backends.perf_model import PerfModelBackend
from backends.perf_model.catalog import load_hardware
from backends.perf_model.constants import Efficiency
from backends.perf_model.memory import plan_memory

GIB = 2**30
CARD_GIB = 95.6
TOKENS = 1024 + 512 + 1  # input + output + the verify window of plain decoding
KIMI_BYTES_PER_GPU_TP8 = 593_872_945_152 / 8  # pinned in test_perf_model_catalog
WORKLOAD = Workload(1024, 512, (1, 64, 149, 256))
SPACIOUS = {"max_running_requests": 256, "cuda_graph_max_bs": 256}


@pytest.fixture
def backend(pcie8_reference):
    return PerfModelBackend(pcie8_reference.deployment, Efficiency())


def _plan(backend, workload=WORKLOAD, **params):
    return backend.setup(LaunchParams(**params), workload).plan


def test_kv_pool_caps_running_requests_by_hand(backend):
    # static pool 0.88 x 95.6 GiB = 90,331,752,169 B; weights 74,234,118,144 B a GPU (TP8)
    # -> KV pool 16,097,634,025 B = 14.99 GiB; MLA latent replicated: 70,272 B a token
    # -> 229,076 tokens / 1,537 a request = 149 requests (the engine would allow 256)
    plan = _plan(backend, **SPACIOUS)
    pool_bytes = 0.88 * CARD_GIB * GIB - KIMI_BYTES_PER_GPU_TP8
    assert plan.kv_pool_gib * GIB == pytest.approx(pool_bytes)
    assert plan.max_requests == 149 == int(pool_bytes / 70_272 // TOKENS)


def test_drafter_weights_and_kv_shrink_the_pool_by_hand(backend):
    # drafter 6,958,350,336 B / 8 = 869,793,792 B a GPU; its KV 6 layers x 4096 B / 8 heads
    # split over 8 GPUs = 3,072 B a token, so 73,344 B a token in all; pool 15,227,840,233 B
    # -> 207,622 tokens / (1024 + 512 + 8) = 134 requests
    dflash = {**SPACIOUS, "ep_size": 8, "speculative_algorithm": "dflash", "cuda_graph": False}
    plan = _plan(backend, **dflash)
    assert plan.drafter_gib * GIB == pytest.approx(869_793_792)
    assert plan.max_requests == 134


def test_max_running_requests_is_the_cap_when_the_pool_is_larger(backend):
    assert _plan(backend, max_running_requests=48).max_requests == 48


def test_throughput_stops_growing_once_the_kv_pool_is_full(backend):
    rows = backend.measure(LaunchParams(**SPACIOUS), WORKLOAD)
    by_level = {m.concurrency: m for m in rows}
    assert by_level[256].output_tok_s == pytest.approx(by_level[149].output_tok_s)
    assert by_level[149].output_tok_s > by_level[64].output_tok_s
    assert by_level[256].ttft_p50_ms > by_level[149].ttft_p50_ms  # the rest queue for a slot


def test_peak_memory_of_a_fitting_config_is_within_the_card(backend):
    for m in backend.measure(LaunchParams(**SPACIOUS), WORKLOAD):
        # weights 69.14 + KV 14.99 + workspace 6.625 = 90.75 GiB
        assert m.peak_mem_gib == pytest.approx(90.75, abs=0.01)
        assert m.peak_mem_gib <= CARD_GIB


# --- configurations that do not fit ------------------------------------------------------------


def _assert_oom(rows, *reason_words):
    assert all(m.failure is FailureClass.OOM for m in rows)
    assert all(not m.ok and m.output_tok_s == 0.0 and m.predicted for m in rows)
    for word in reason_words:
        assert word in rows[0].log_excerpt, rows[0].log_excerpt


def test_tp4_dp2_does_not_hold_the_weights(backend):
    # 594 GB / 4 GPUs = 138.3 GiB a GPU > 84.1 GiB static pool
    _assert_oom(backend.measure(LaunchParams(tp_size=4, dp_size=2), WORKLOAD), "138.3 GiB", "84.1 GiB")


def test_attention_dp_on_96_gb_does_not_fit(backend):
    # BF16 non-expert weights replicated: 23,112,056,832 B = 21.52 GiB; routed experts
    # 570,760,888,320 B / 8 = 66.45 GiB -> 87.97 GiB a GPU > 84.1 GiB (REFERENCE_NUMBERS)
    _assert_oom(backend.measure(LaunchParams(enable_dp_attention=True), WORKLOAD), "88.0 GiB")


def test_attention_dp_fits_on_h200_and_its_kv_capacity_adds_up(kimi):
    lp = LaunchParams(enable_dp_attention=True, max_running_requests=4096)
    plan = plan_memory(kimi, None, lp, load_hardware("h200-sxm").memory_gib, TOKENS)
    assert plan.weights_gib == pytest.approx(87.97, abs=0.01)
    # pool 0.88 x 139 - 87.97 = 34.35 GiB; a token costs 70,272 / 8 B on its rank:
    # 34.35 GiB x 8 / 70,272 B = 4,200,000 tokens / 1,537 = 2,732 requests
    assert plan.max_requests == int(plan.kv_pool_gib * GIB * 8 / 70_272 // TOKENS)
    assert 2700 < plan.max_requests < 2760


def test_mem_fraction_too_high_leaves_no_room_for_activations(backend):
    # workspace 2 GiB reserve + 0.5 graphs + 8192 tokens x (163,840 x 4 / 8 + 32 x 7168 x 2) B
    # = 2.5 + 4.125 = 6.625 GiB > 95.6 x 0.05 = 4.78 GiB outside the static pool
    rows = backend.measure(LaunchParams(mem_fraction_static=0.95), WORKLOAD)
    _assert_oom(rows, "6.6 GiB", "4.8 GiB")


def test_vllm_holds_its_workspace_inside_its_memory_fraction(kimi):
    # The same 0.95: SGLang's static pool leaves 4.8 GiB beside it for 6.6 GiB of workspace;
    # vLLM's gpu_memory_utilization bounds the whole instance, so it fits, its KV pool the
    # static pool less the weights and that workspace.
    lp = LaunchParams(mem_fraction_static=0.95)
    memory = load_hardware("rtx-pro-6000-server").memory_gib
    sglang = plan_memory(kimi, None, lp, memory, TOKENS)
    vllm = plan_memory(kimi, None, lp, memory, TOKENS, engine="vllm")
    assert "outside" in sglang.infeasible and not vllm.infeasible
    assert vllm.workspace_gib == pytest.approx(6.625, abs=0.01)
    assert vllm.kv_pool_gib == pytest.approx(sglang.kv_pool_gib - vllm.workspace_gib)
    assert vllm.max_requests > 0


def test_context_longer_than_the_kv_pool_is_oom(backend):
    # 229,076 tokens fit; one request of 250,000 + 1,000 + 1 does not
    rows = backend.measure(LaunchParams(), Workload(250_000, 1000, (1,)))
    _assert_oom(rows, "251001")


def test_same_config_fits_with_a_smaller_static_fraction(backend):
    assert not _plan(backend, mem_fraction_static=0.88).infeasible
    assert _plan(backend, mem_fraction_static=0.70).infeasible  # 66.9 GiB < 69.1 of weights


def test_knobs_only_a_measurement_tells_apart_are_priced_at_their_defaults(backend):
    # The model does not guess what NCCL's protocol or P2P level or the custom all-reduce do
    # on PCIe: the same prediction as the engine's defaults (`best` marks them measured only).
    plain = backend.measure(LaunchParams(**SPACIOUS), WORKLOAD)
    tuned = backend.measure(LaunchParams(**SPACIOUS, nccl_proto="LL128", nccl_p2p_level="LOC",
                                         disable_custom_all_reduce=True), WORKLOAD)
    assert [m.output_tok_s for m in tuned] == [m.output_tok_s for m in plain]
    assert backend.env(LaunchParams(nccl_proto="LL128")) == {"NCCL_PROTO": "LL128"}
