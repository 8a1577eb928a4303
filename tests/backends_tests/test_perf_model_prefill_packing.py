"""How the model prices the prefills a running batch waits for, by the engine's scheduler:
SGLang runs the prompts waiting as a prefill batch of their own between two decode steps, so at
low arrival rates each prompt is prefilled alone and reads every weight; vLLM puts new prompts
into the decode step's own batch, so they share the weight reads the step does anyway."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.contract import Workload
from backends.launch_params import LaunchParams
from backends.perf_model.backend import PerfModelBackend
from backends.perf_model.predict import prompts_packed
from backends.perf_model.shipped import default_efficiency

TP8 = LaunchParams.from_params({"tp_size": 8, "cuda_graph": True, "cuda_graph_max_bs": 256,
                                "max_running_requests": 256})


def test_a_prefill_batch_of_its_own_packs_the_prompts_that_arrived_since_the_last():
    # 64 requests of 512 rounds: one finishes every eighth round, so a prefill finds one prompt.
    assert prompts_packed("sglang", 64, 512) == 1
    # 256 requests of 8 rounds: 32 arrive a round.
    assert prompts_packed("sglang", 256, 8) == 32
    packed = [prompts_packed("sglang", batch, 16) for batch in (1, 8, 32, 64, 128, 256)]
    assert packed == sorted(packed) and packed[0] == 1 < packed[-1]


def test_an_engine_that_prefills_inside_the_decode_step_spreads_prompts_over_its_steps():
    assert prompts_packed("vllm", 64, 512) == 64


def _prompt_cost_ms(deployment, concurrency: int) -> tuple[float, float]:
    """(ms one prompt costs the running batch at this level, ms of a lone prompt's prefill), on
    short prompts: a lone one's forward is bound by its weight reads."""
    backend = PerfModelBackend(deployment, default_efficiency(deployment.gpu, deployment.engine,
                                                              deployment.measured_kernels))
    workload = Workload(128, 512, (concurrency,))
    [m] = backend.measure(TP8, workload)
    share_ms = m.breakdown_ms["prefill_share"]  # a round's share of the prefills
    step_ms = sum(m.breakdown_ms.values()) - share_ms
    lone_ms = m.ttft_p50_ms - step_ms  # a request's first token: its prefill, then one step
    return share_ms * 512 / concurrency, lone_ms


@pytest.mark.parametrize("measured", [False, True], ids=["roofline", "measured-kernels"])
def test_sglang_prefills_each_arriving_prompt_alone_and_vllm_shares_the_step(pcie8_reference,
                                                                             measured):
    sglang = replace(pcie8_reference.deployment, measured_kernels=measured)
    per_prompt, lone = _prompt_cost_ms(sglang, 64)
    assert per_prompt == pytest.approx(lone)
    vllm = replace(sglang, engine="vllm")
    per_prompt, lone = _prompt_cost_ms(vllm, 64)
    assert per_prompt < 0.5 * lone
