"""An eager prefill's host work per MoE layer (``Efficiency.prefill_moe_host_us``): it overlaps
the prefill's GPU time, so a short prompt on a fast GPU waits for all of it (SGLang's
one-request TTFT of an MLA + MoE model barely grows with the prompt), a long prompt's GPU time
hides all but the share a step always exposes, a dense model has no MoE layer to pay it, and a
prefill the release replays as CUDA graphs runs no Python layer by layer to pay it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.contract import Workload
from backends.launch_params import LaunchParams
from backends.perf_model.backend import PerfModelBackend
from backends.perf_model.constants import EXPOSED_HOST_FLOOR
from backends.perf_model.shipped import default_efficiency

TP8 = LaunchParams.from_params({"tp_size": 8, "cuda_graph": True, "cuda_graph_max_bs": 256,
                                "max_running_requests": 256})


def _lone_prefill_ms(deployment, input_len: int, host_us: float) -> float:
    """A lone prompt's prefill: a request's first token at one request, less its one step."""
    eff = default_efficiency(deployment.gpu, deployment.engine, True)
    backend = PerfModelBackend(deployment, eff.with_values(prefill_moe_host_us=host_us))
    [m] = backend.measure(TP8, Workload(input_len, 64, (1,)))
    step_ms = sum(m.breakdown_ms.values()) - m.breakdown_ms["prefill_share"]
    return m.ttft_p50_ms - step_ms


def _node(reference, gpu: str, model: str):
    return replace(reference.deployment, gpu=gpu, model=model, drafter=None,
                   measured_kernels=True)


def test_a_short_prompt_waits_for_the_hosts_moe_work_and_ttft_flattens(pcie8_reference):
    deepseek = _node(pcie8_reference, "b200-sxm", "deepseek-v3-fp8")
    layers = 58  # DeepSeek-V3's MoE layers
    short, long = (_lone_prefill_ms(deepseek, n, 2000.0) for n in (128, 2048))
    assert short >= layers * 2.0
    assert _lone_prefill_ms(deepseek, 128, 0.0) < layers * 2.0
    # host-bound: 16x the prompt costs far less than without the host's share
    bare_growth = _lone_prefill_ms(deepseek, 2048, 0.0) / _lone_prefill_ms(deepseek, 128, 0.0)
    assert long / short < bare_growth


def test_a_prompt_whose_gpu_time_exceeds_the_hosts_hides_all_but_the_exposed_floor(
        pcie8_reference):
    # The PCIe node's 1,024-token Kimi prefill is bound by its all-reduces, not by its host.
    # SGLang 0.5.13 runs it eagerly (no prefill graphs for a multimodal architecture).
    kimi = replace(pcie8_reference.deployment, drafter=None, measured_kernels=True,
                   engine_version="0.5.13")
    layers = 60  # Kimi K2.6's MoE layers
    extra = _lone_prefill_ms(kimi, 1024, 1000.0) - _lone_prefill_ms(kimi, 1024, 0.0)
    assert extra == pytest.approx(EXPOSED_HOST_FLOOR * layers * 1.0)


def test_a_dense_model_has_no_moe_layer_to_pay_it(pcie8_reference):
    dense = _node(pcie8_reference, "b200-sxm", "qwen3-8b")
    assert _lone_prefill_ms(dense, 128, 3000.0) == pytest.approx(
        _lone_prefill_ms(dense, 128, 0.0))


def test_a_graphed_prefill_pays_none_of_it(pcie8_reference):
    # DeepSeek-V3 replays its prefills as CUDA graphs in SGLang 0.5.23 on an H200, not on a
    # B200 (trtllm_mla there), and not in 0.5.15 (MLA) on either.
    h200 = _node(pcie8_reference, "h200-sxm", "deepseek-v3-fp8")
    assert _lone_prefill_ms(h200, 1024, 3000.0) == pytest.approx(
        _lone_prefill_ms(h200, 1024, 0.0))
    for eager in (_node(pcie8_reference, "b200-sxm", "deepseek-v3-fp8"),
                  replace(h200, engine_version="0.5.15")):
        assert _lone_prefill_ms(eager, 1024, 3000.0) > _lone_prefill_ms(eager, 1024, 0.0) + 10
