"""A MoE layer's shared expert on the engines' second CUDA stream, beside the routed experts
(perf_model/streams.py), priced on the real measured tables of the RTX PRO 6000 node and the
H200; and vLLM's block-FP8 GEMM rows, which the model leaves out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.launch_params import LaunchParams
from backends.perf_model.catalog import load_hardware, load_model
from backends.perf_model.constants import Efficiency
from backends.perf_model.kernels.tables import KernelTables, contradicted, tables_for
from backends.perf_model.node import Node
from backends.perf_model.shapes import SHARED_EXPERT
from backends.perf_model.step import target_forward
from backends.perf_model.streams import SHARED_STREAM_MAX_TOKENS as MOST
from backends.perf_model.streams import shared_expert_beside_routed
from backends.perf_model.terms import MEASURED, MLA_BLOCK_LINEARS, ROOFLINE, Term, concurrent
from backends.perf_model.terms import gemms

TP8 = LaunchParams(tp_size=8)
TP8_EP8 = LaunchParams(tp_size=8, ep_size=8)


@pytest.fixture(scope="module")
def dsv3():
    return load_model("deepseek-v3-fp8")


def _node(gpu: str, engine: str) -> Node:
    hw = load_hardware(gpu)
    return Node(hw, Efficiency(), tables_for(hw.measured_system, engine), engine)


def test_sglang_runs_the_shared_expert_beside_the_routed_ones_only_inside_a_graph(kimi):
    assert shared_expert_beside_routed("sglang", kimi, TP8, 8, use_graph=True)
    assert not shared_expert_beside_routed("sglang", kimi, TP8, 8, use_graph=False)
    # past 256 tokens a step the second stream is credited with nothing (vLLM's measurement)
    assert shared_expert_beside_routed("sglang", kimi, TP8, MOST, use_graph=True)
    assert not shared_expert_beside_routed("sglang", kimi, TP8, MOST + 1, use_graph=True)


def test_sglang_folds_deepseek_v3s_shared_expert_into_the_moe_kernel_without_ep(dsv3, kimi):
    """256 routed experts and one shared: one more expert in the MoE kernel (in sequence with
    nothing), unless the experts are split over EP ranks; Kimi's 384 never fold."""
    assert not shared_expert_beside_routed("sglang", dsv3, TP8, 8, use_graph=True)
    assert shared_expert_beside_routed("sglang", dsv3, TP8_EP8, 8, use_graph=True)
    assert shared_expert_beside_routed("sglang", kimi, TP8, 8, use_graph=True)


def test_sglang_runs_kimi_k3s_shared_experts_in_sequence_and_vllm_beside(kimi):
    """K3's LatentMoE reads the shared experts' gate / up with the router in one GEMM."""
    k3 = load_model("kimi-k3")
    assert k3.shared_expert_params and k3.expert_hidden != k3.hidden
    assert not shared_expert_beside_routed("sglang", k3, TP8, 8, use_graph=True)
    assert shared_expert_beside_routed("vllm", k3, TP8, 8, use_graph=True)


def test_vllm_runs_it_beside_them_eager_or_graphed_up_to_its_token_threshold(kimi):
    for graph in (True, False):
        assert shared_expert_beside_routed("vllm", kimi, TP8, MOST, graph)
        assert not shared_expert_beside_routed("vllm", kimi, TP8, MOST + 1, graph)


def test_our_engine_and_models_without_a_shared_expert_run_one_stream(kimi):
    assert not shared_expert_beside_routed("dflash", kimi, TP8, 8, use_graph=True)
    qwen = load_model("qwen3-235b-a22b")
    assert not shared_expert_beside_routed("vllm", qwen, TP8, 8, use_graph=True)


def test_two_streams_take_the_longer_but_never_beat_their_joint_speed_of_light():
    long, short = Term(5.0, MEASURED, 2.0), Term(1.0, ROOFLINE, 0.5)
    assert concurrent(long, short) == Term(5.0, "measured+roofline", 2.5)
    near_sol = concurrent(Term(1.0, MEASURED, 0.9), Term(1.0, MEASURED, 0.9))
    assert near_sol.ms == pytest.approx(1.8)


def test_a_graphed_sglang_step_hides_the_shared_expert_behind_the_routed_experts(kimi):
    """The user's node, Kimi K2.6 TP8, 8 requests: graphed, the shared expert's GEMMs leave the
    dense GEMMs and the MoE term is the longer stream; eager, they add as before."""
    node = _node("rtx-pro-6000-server", "sglang")
    graphed = target_forward(node, kimi, TP8, 8, 1, 2048, True, 8)
    eager = target_forward(node, kimi, TP8, 8, 1, 2048, False)
    shared = gemms(node, tuple(x for x in kimi.linears if x.name.startswith(SHARED_EXPERT)),
                   8, 8)
    assert shared.source == MEASURED and shared.ms > 0
    assert eager.gemm.ms == pytest.approx(graphed.gemm.ms + shared.ms)
    assert graphed.moe.ms == pytest.approx(max(eager.moe.ms, shared.ms,
                                               eager.moe.sol_ms + shared.sol_ms))
    assert graphed.moe.sol_ms == pytest.approx(eager.moe.sol_ms + shared.sol_ms)
    assert graphed.gemm.ms + graphed.moe.ms < eager.gemm.ms + eager.moe.ms


def test_past_vllms_threshold_the_shared_expert_is_back_in_sequence(kimi):
    node = _node("h200-sxm", "vllm")
    rows = MOST + 1
    beside = target_forward(node, kimi, TP8, MOST, 1, 2048, True, MOST)
    serial = target_forward(node, kimi, TP8, rows, 1, 2048, True, rows)
    rest = tuple(x for x in kimi.linears if x.name not in MLA_BLOCK_LINEARS)  # vLLM's block
    alone = tuple(x for x in rest if not x.name.startswith(SHARED_EXPERT))
    assert len(alone) < len(rest)
    assert beside.gemm.ms == pytest.approx(gemms(node, alone, MOST, 8).ms)
    assert serial.gemm.ms == pytest.approx(gemms(node, rest, rows, 8).ms)


def test_vllms_block_fp8_gemm_rows_are_left_out_and_per_tensor_fp8_stands_in(dsv3):
    """Timed with a floor the shape does not move (60 us on the H200, 4-7 us in SGLang's rows
    of the same GPU): the lookup answers None and the per-tensor FP8 row prices the GEMM."""
    vllm, sglang = KernelTables("h200_sxm", "vllm"), KernelTables("h200_sxm", "sglang")
    assert contradicted("h200_sxm", "vllm", "gemm_perf.parquet", {"gemm_dtype": "fp8_block"})
    assert vllm.gemm_ms(4, 4096, 7168, "fp8_block") is None
    assert sglang.gemm_ms(4, 4096, 7168, "fp8_block") < 0.03
    node = _node("h200-sxm", "vllm")
    gate_up = next(x for x in dsv3.linears if x.name == f"{SHARED_EXPERT}.gate_up")
    n, k = gate_up.on_rank(8)
    priced = gemms(node, (gate_up,), 4, 8)
    assert priced.source == MEASURED
    assert priced.ms == pytest.approx(vllm.gemm_ms(4, n, k, "fp8") * gate_up.per_forward)


def test_eager_vllm_steps_overlap_too(kimi):
    node = _node("h200-sxm", "vllm")
    eager = target_forward(node, kimi, replace(TP8, cuda_graph=False), 8, 1, 2048, False)
    graphed = target_forward(node, kimi, TP8, 8, 1, 2048, True, 8)
    assert eager.moe.ms == pytest.approx(graphed.moe.ms)
    assert eager.gemm.ms == pytest.approx(graphed.gemm.ms)
