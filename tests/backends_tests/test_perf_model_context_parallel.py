"""Decode context parallelism (vLLM's --decode-context-parallel-size) on the user's node: each of
``dcp`` ranks of the TP group keeps 1/dcp of every request's KV and attends for the whole group's
queries over it, with a gather of the queries and a reduce-scatter of the partial outputs in
every layer. More KV capacity, less KV read a rank, more collectives: slower at short context,
faster where the KV pool caps the running requests. Priced with the fitted roofline and with
measured kernels alike."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.contract import Workload
from backends.launch_params import LaunchParams
from backends.perf_model import PerfModelBackend
from backends.perf_model.predict import step_breakdown
from backends.perf_model.shipped import default_efficiency

SHORT = Workload(1024, 512, (1,))
LONG = Workload(32768, 4096, (64,))  # long prompts, long answers: the KV pool binds
RUN = {"max_running_requests": 64, "cuda_graph_max_bs": 64}


@pytest.fixture(params=[False, True], ids=["roofline", "measured"])
def backend(request, pcie8_reference):
    node = replace(pcie8_reference.deployment, engine="vllm", measured_kernels=request.param)
    return PerfModelBackend(node, default_efficiency(node.gpu, "vllm", request.param))


def _at(backend, workload, dcp):
    lp = LaunchParams(decode_context_parallel_size=dcp, **RUN)
    return backend.setup(lp, workload), backend.measure(lp, workload)[0]


def test_each_rank_keeps_a_dcp_th_of_the_kv_so_more_requests_run(backend):
    plans = {dcp: _at(backend, LONG, dcp)[0].plan for dcp in (1, 2, 8)}
    assert plans[1].kv_pool_gib == plans[8].kv_pool_gib  # the same pool holds more tokens
    assert plans[1].max_requests < 16
    for dcp in (2, 8):  # whole requests: a rounding's worth above the ratio
        assert dcp * plans[1].max_requests <= plans[dcp].max_requests <= dcp * (
            plans[1].max_requests + 1)


def test_a_step_reads_less_kv_a_rank_and_communicates_more(backend):
    context = LONG.input_len + LONG.output_len / 2
    one, eight = (step_breakdown(_at(backend, LONG, dcp)[0], 4, context) for dcp in (1, 8))
    assert eight["attention"] < one["attention"]
    assert eight["comm"] > one["comm"]


def test_slower_at_short_context_faster_where_the_kv_pool_binds(backend):
    assert _at(backend, SHORT, 2)[1].output_tok_s < _at(backend, SHORT, 1)[1].output_tok_s
    assert _at(backend, LONG, 8)[1].output_tok_s > 1.5 * _at(backend, LONG, 1)[1].output_tok_s


def test_an_sglang_launch_with_context_parallelism_is_refused_not_priced(pcie8_reference):
    sglang = PerfModelBackend(pcie8_reference.deployment)
    rows = sglang.measure(LaunchParams(decode_context_parallel_size=2, **RUN), SHORT)
    assert not rows[0].ok and "decode_context_parallel_size=2" in rows[0].log_excerpt
