"""vLLM's MLA block from its measured MLA module tables (the H200's, real): the block's four
GEMMs and its absorbed attention are one measured term, so the dense-GEMM term leaves them out;
a verify is composed from the single-query rows; SGLang and shapes the tables never timed keep
the per-kernel composition."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.launch_params import LaunchParams
from backends.perf_model.catalog import _catalog, load_hardware, load_model, model_from_config
from backends.perf_model.kernels.tables import KernelTables, tables_for
from backends.perf_model.node import Node
from backends.perf_model.shapes import SHARED_EXPERT
from backends.perf_model.shipped import default_efficiency
from backends.perf_model.step import target_forward
from backends.perf_model.terms import MEASURED, MLA_BLOCK_LINEARS, gemms, mla_block

H200_VLLM = KernelTables("h200_sxm", "vllm")
LP = LaunchParams(tp_size=8)


def _node(engine: str) -> Node:
    hw = load_hardware("h200-sxm")
    return Node(hw, default_efficiency(hw.name, engine, True),
                tables_for(hw.measured_system, engine), engine)


@pytest.fixture(scope="module")
def dsv3():
    return load_model("deepseek-v3-fp8")


def test_a_decode_step_prices_the_block_from_the_module_table_and_its_gemms_once(dsv3):
    node = _node("vllm")
    fwd = target_forward(node, dsv3, LP, 4, 1, 1000, True, 4)
    # 128 heads / TP8 = 16 a rank, FP8 block GEMMs, four requests over 1,000 + 1 cached tokens
    each = H200_VLLM.mla_module_ms(4, 16, 1001, "fp8_block")
    assert fwd.attention.source == MEASURED
    assert fwd.attention.ms == pytest.approx(each * 61)
    # the shared expert runs beside the routed experts (streams.py), in the moe term
    rest = tuple(x for x in dsv3.linears if x.name not in MLA_BLOCK_LINEARS
                 and not x.name.startswith(SHARED_EXPERT))
    assert fwd.gemm.ms == pytest.approx(gemms(node, rest, 4, 8).ms)
    assert len(rest) < len(dsv3.linears) - 2


def test_a_verify_reads_each_requests_kv_once_for_all_its_queries(dsv3):
    """Eight queries a request: the block's single-query rows eight times over, plus the KV
    read of four requests (what 1,008 cached tokens add over the tables' shortest)."""
    node = _node("vllm")
    verify = mla_block(node, dsv3, 16, 4, 32, 8, 1000, prompt=False)
    rows = H200_VLLM.mla_module_ms(32, 16, 2, "fp8_block")
    kv = (H200_VLLM.mla_module_ms(4, 16, 1008, "fp8_block")
          - H200_VLLM.mla_module_ms(4, 16, 2, "fp8_block"))
    assert verify.ms == pytest.approx((rows + kv) * 61)
    one = mla_block(node, dsv3, 16, 4, 4, 1, 1000, prompt=False)
    assert one.ms < verify.ms < 8 * one.ms


def test_a_prompt_chunk_is_the_prompt_module_table(dsv3):
    node = _node("vllm")
    fwd = target_forward(node, dsv3, LP, 2, 1024, 512, False, prefill=True)
    assert fwd.attention.ms == pytest.approx(
        H200_VLLM.mla_module_ms(2, 16, 1024, "fp8_block", prompt=True) * 61)


def test_sglang_and_other_mla_shapes_keep_the_kernel_by_kernel_composition(dsv3):
    assert mla_block(_node("sglang"), dsv3, 16, 4, 4, 1, 1000, prompt=False) is None
    config = dict(_catalog("models.yaml")["models"]["deepseek-v3-fp8"], kv_lora_rank=256)
    narrow = model_from_config("narrow-latent", config)
    assert mla_block(_node("vllm"), narrow, 16, 4, 4, 1, 1000, prompt=False) is None
    node = _node("vllm")
    fwd = target_forward(node, narrow, LP, 4, 1, 1000, True, 4)
    outside = tuple(x for x in narrow.linears if not x.name.startswith(SHARED_EXPERT))
    assert fwd.gemm.ms == pytest.approx(gemms(node, outside, 4, 8).ms)


def test_kimi_k2_shares_the_block_shape_with_half_the_heads():
    kimi = load_model("kimi-k2.6")
    block = mla_block(_node("vllm"), kimi, 8, 16, 16, 1, 2000, prompt=False)
    assert block is not None and block.ms == pytest.approx(
        H200_VLLM.mla_module_ms(16, 8, 2001, "bfloat16") * 61)
    shapeless = replace(kimi, linears=())  # nothing says its block is DeepSeek-V3's
    assert mla_block(_node("vllm"), shapeless, 8, 16, 16, 1, 2000, prompt=False) is None


def test_under_context_parallelism_a_rank_attends_for_more_heads_over_less_context(dsv3):
    """DCP 2: each rank keeps half of every request's KV and attends for both ranks' heads."""
    node = _node("vllm")
    block = mla_block(node, dsv3, 16, 4, 4, 1, 8000, prompt=False, dcp=2)
    kv = (H200_VLLM.mla_module_ms(4, 32, 4001, "fp8_block")
          - H200_VLLM.mla_module_ms(4, 32, 2, "fp8_block"))
    assert block.ms == pytest.approx((H200_VLLM.mla_module_ms(4, 16, 2, "fp8_block") + kv) * 61)
