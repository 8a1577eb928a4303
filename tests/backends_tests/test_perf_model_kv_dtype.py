"""An 8-bit KV cache (kv_cache_dtype) in the performance model: half the bytes a cached token,
so twice the tokens in the same pool; attention from the tables' rows for that cache where they
time one (the real tables of the RTX PRO 6000 node and the H200), the bf16 cache's time
standing in where they do not, and half the KV bytes on the roofline."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.launch_params import LaunchParams
from backends.perf_model.catalog import load_hardware, load_model
from backends.perf_model.constants import Efficiency
from backends.perf_model.kernels.tables import KernelTables, contradicted, tables_for
from backends.perf_model.memory import kv_capacity_tokens, plan_memory
from backends.perf_model.node import Node
from backends.perf_model.step import target_forward
from backends.perf_model.terms import BF16_KV, MEASURED, ROOFLINE, Term, decode_attention

FP8 = LaunchParams(tp_size=8, kv_cache_dtype="fp8_e4m3")
BF16 = LaunchParams(tp_size=8)


def _node(gpu: str, engine: str | None) -> Node:
    hw = load_hardware(gpu)
    return Node(hw, Efficiency(), engine and tables_for(hw.measured_system, engine),
                engine or "sglang")


def test_an_fp8_cache_holds_twice_the_tokens_and_runs_more_requests():
    kimi = load_model("kimi-k2.6")
    long = dict(memory_gib=95.6, tokens_per_request=32_768, engine="sglang")
    lp = replace(BF16, mem_fraction_static=0.92, max_running_requests=256)
    bf16, fp8 = plan_memory(kimi, None, lp, **long), plan_memory(
        kimi, None, replace(lp, kv_cache_dtype="fp8_e4m3"), **long)
    assert fp8.kv_pool_gib == bf16.kv_pool_gib
    assert kv_capacity_tokens(kimi, None, replace(lp, kv_cache_dtype="fp8_e5m2"),
                              bf16.kv_pool_gib) == pytest.approx(
        2 * kv_capacity_tokens(kimi, None, lp, bf16.kv_pool_gib))
    assert 0 < 2 * bf16.max_requests <= fp8.max_requests <= 2 * bf16.max_requests + 1


def test_gqa_decode_attention_reads_the_tables_fp8_rows():
    """Qwen3-8B's cache on a rank of TP8 (4 query heads, 1 KV head), RTX PRO 6000 under
    SGLang: both caches are timed. Over 64 requests of 16k tokens the 8-bit one is faster; for
    one request of 1k it is slower, as its rows say."""
    node, pcie = _node("rtx-pro-6000-server", "sglang"), KernelTables("rtx_pro_6000_server",
                                                                       "sglang")
    none = Term(0.0, ROOFLINE)
    fp8 = decode_attention(node, 36, 4, 1, 128, 64, 1, 16_384, none, "fp8")
    bf16 = decode_attention(node, 36, 4, 1, 128, 64, 1, 16_384, none)
    assert fp8.source == bf16.source == MEASURED
    assert fp8.ms == pytest.approx(36 * pcie.attention_generation_ms(64, 4, 1, 128, 16_385,
                                                                     "fp8"))
    assert fp8.ms < 0.8 * bf16.ms
    short = [decode_attention(node, 36, 4, 1, 128, 1, 1, 1024, none, kv).ms
             for kv in ("fp8", "bfloat16")]
    assert short[0] > short[1]


def test_where_no_table_times_an_fp8_cache_the_bf16_time_stands_in_and_says_so():
    """SGLang's MLA decode on the RTX PRO 6000 was timed with a bf16 cache only; the H200's
    tables time both, and there the 8-bit kernel is the slower one: no bf16 time is scaled."""
    kimi, none = load_model("kimi-k2.6"), Term(0.0, ROOFLINE)
    pcie = _node("rtx-pro-6000-server", "sglang")
    fp8 = decode_attention(pcie, 61, 8, 0, 128, 32, 1, 4096, none, "fp8")
    bf16 = decode_attention(pcie, 61, 8, 0, 128, 32, 1, 4096, none)
    assert (fp8.source, bf16.source) == (BF16_KV, MEASURED)
    assert fp8.ms == bf16.ms
    h200 = _node("h200-sxm", "sglang")
    assert decode_attention(h200, 61, 8, 0, 128, 32, 1, 4096, none, "fp8").ms > 1.5 * (
        decode_attention(h200, 61, 8, 0, 128, 32, 1, 4096, none).ms)
    step = target_forward(pcie, kimi, FP8, 32, 1, 4096, True, 32)
    assert step.attention.source == BF16_KV


def test_contradicted_rows_are_left_out_and_the_step_says_what_stood_in():
    """vLLM's FP8 MLA decode rows of the RTX PRO 6000 (10-17x bf16, against the community's
    equal speeds) are never read: the block is the bf16 cache's; the H200's are read."""
    kimi = load_model("kimi-k2.6")
    rtx = KernelTables("rtx_pro_6000_server", "vllm")
    assert contradicted("rtx_pro_6000_server", "vllm", "mla_generation_module_perf.parquet",
                        {"kv_cache_dtype": "fp8"})
    assert rtx.mla_module_ms(8, 8, 4096, "bfloat16", kv_dtype="fp8") is None
    assert rtx.mla_module_ms(8, 8, 4096, "bfloat16") is not None
    assert KernelTables("h200_sxm", "vllm").mla_module_ms(8, 16, 4096, "fp8_block",
                                                          kv_dtype="fp8") is not None
    node = _node("rtx-pro-6000-server", "vllm")
    fp8 = target_forward(node, kimi, FP8, 8, 1, 4096, True, 8)
    bf16 = target_forward(node, kimi, BF16, 8, 1, 4096, True, 8)
    assert (fp8.attention.source, bf16.attention.source) == (BF16_KV, MEASURED)
    assert fp8.attention.ms == pytest.approx(bf16.attention.ms)


def test_without_tables_the_roofline_reads_half_the_cache():
    kimi, node = load_model("kimi-k2.6"), _node("rtx-pro-6000-server", None)
    long = dict(batch=64, tokens_per_req=1, context=32_768, use_graph=True)
    fp8, bf16 = (target_forward(node, kimi, lp, **long).attention for lp in (FP8, BF16))
    assert fp8.source == bf16.source == ROOFLINE
    assert fp8.ms == pytest.approx(bf16.ms / 2)
