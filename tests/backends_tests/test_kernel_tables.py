"""The measured kernel tables (aiconfigurator-core's silicon data) as the model reads them:
the real tables of the RTX PRO 6000 server node and of an NVLink GPU, never a made-up one."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from backends.perf_model.kernels.grid import Grid
from backends.perf_model.kernels.tables import KernelTables, table_path, tables_for
from backends.perf_model.catalog import load_hardware
from backends.perf_model.constants import Efficiency
from backends.perf_model.step import Node
from backends.perf_model.terms import MEASURED, ROOFLINE, Term, decode_attention, experts

PCIE = KernelTables("rtx_pro_6000_server", "sglang")
NVLINK = KernelTables("h200_sxm", "sglang")


def _rows(system: str, family: str, engine: str, file: str, **where) -> dict[str, np.ndarray]:
    table = pq.read_table(table_path(system, family, engine, file)).to_pydict()
    keep = [i for i in range(len(table["latency"]))
            if all(table[k][i] == v for k, v in where.items())]
    return {k: np.array(v)[keep] for k, v in table.items()}


@pytest.mark.parametrize("tables", [PCIE, NVLINK], ids=["pcie", "nvlink"])
def test_a_gemm_on_the_grid_is_the_measured_row(tables):
    rows = _rows(tables.system, "gemm", "sglang", "gemm_perf.parquet", gemm_dtype="bfloat16",
                 n=2048, k=7168)
    for m, latency in list(zip(rows["m"], rows["latency"]))[:5]:
        assert tables.gemm_ms(int(m), 2048, 7168, "bfloat16") == pytest.approx(latency)


def test_between_grid_points_a_gemm_is_interpolated_and_past_the_last_row_it_scales():
    low, high = (PCIE.gemm_ms(m, 7168, 2048, "bfloat16") for m in (16384, 32768))
    middle = PCIE.gemm_ms(24576, 7168, 2048, "bfloat16")
    assert middle == pytest.approx((low + high) / 2)
    last = PCIE.gemm_ms(32768, 7168, 2048, "bfloat16")
    assert PCIE.gemm_ms(65536, 7168, 2048, "bfloat16") == pytest.approx(2 * last)


def test_kimi_experts_are_measured_for_every_tp_ep_split():
    """Kimi K2's MoE (7168 / 2048 / 384 experts / top-8, INT4 Marlin) on 8 PCIe GPUs."""
    shape = dict(hidden=7168, inter=2048, top_k=8, experts=384, dtype="int4_wo",
                 distribution="power_law_1.01")
    for tp, ep in ((8, 1), (4, 2), (2, 4), (1, 8)):
        assert PCIE.moe_ms(64, moe_tp=tp, moe_ep=ep, **shape) > 0
    rows = _rows("rtx_pro_6000_server", "moe", "sglang", "moe_perf.parquet", moe_dtype="int4_wo",
                 num_experts=384, moe_tp_size=1, moe_ep_size=8, distribution="power_law_1.01",
                 num_tokens=1024)
    assert PCIE.moe_ms(1024, moe_tp=1, moe_ep=8, **shape) == pytest.approx(rows["latency"][0])


KIMI_TP8_EXPERT = 7168 * 2048 * 3 * 0.5 / 8  # INT4 bytes of one expert's slice on a TP8 rank


def _balanced_tb_s(tables: KernelTables, tokens: int) -> float:
    """What Kimi's TP8 MoE row of ``tokens`` evenly routed tokens streamed, in TB/s."""
    ms = tables.moe_ms(tokens, 7168, 2048, 8, 384, 8, 1, "int4_wo", "balanced")
    return min(8 * tokens, 384) * KIMI_TP8_EXPERT / ms / 1e9


def test_a_row_faster_than_memory_ran_warm_and_is_left_out_for_its_neighbours():
    """The RTX PRO 6000's 4-token row streams 32 experts' 88 MB at ~2.3 TB/s, above the card's
    1.6 TB/s: they stayed in its 128 MB L2 between the benchmark's runs, and at 8 tokens (176 MB)
    the rate is back to ~1.2 TB/s. The H200's rows rise smoothly under its 4.8 TB/s."""
    datasheet = {PCIE: 1.597, NVLINK: 4.8}
    assert _balanced_tb_s(PCIE, 4) > 1.3 * datasheet[PCIE] > _balanced_tb_s(PCIE, 8)
    assert all(_balanced_tb_s(NVLINK, n) < datasheet[NVLINK] for n in (1, 2, 4, 8, 16, 32))

    def cold_ms(n: float) -> float:  # the same routing, every byte at the datasheet rate
        return min(8 * n, 384) * KIMI_TP8_EXPERT / (datasheet[PCIE] * 1e9)

    shape = dict(hidden=7168, inter=2048, top_k=8, experts=384, moe_tp=8, moe_ep=1,
                 dtype="int4_wo", distribution="power_law_1.01")
    two, four, eight = (PCIE.moe_ms(n, **shape) for n in (2, 4, 8))
    assert PCIE.moe_ms(4, cold_ms=cold_ms, **shape) == pytest.approx(two + (eight - two) / 3)
    assert PCIE.moe_ms(4, cold_ms=cold_ms, **shape) > 1.5 * four
    for n in (1, 2, 8, 16):  # rows within the memory's rate stand
        assert PCIE.moe_ms(n, cold_ms=cold_ms, **shape) == PCIE.moe_ms(n, **shape)
    nvlink_cold = lambda n: cold_ms(n) * datasheet[PCIE] / datasheet[NVLINK]  # noqa: E731
    assert NVLINK.moe_ms(4, cold_ms=nvlink_cold, **shape) == NVLINK.moe_ms(4, **shape)


def test_a_shape_no_table_holds_answers_none():
    assert PCIE.moe_ms(8, 7168, 2048, 8, 384, 8, 1, "no_such_dtype", "balanced") is None
    assert PCIE.moe_ms(8, 1234, 2048, 8, 384, 8, 1, "int4_wo", "balanced") is None
    assert tables_for("", "sglang") is None
    assert tables_for("no_such_system", "sglang") is None


def test_pcie_all_reduce_grows_with_the_message_and_nvlink_is_faster():
    small, large = (PCIE.collective_ms("all_reduce", e, 8) for e in (8192, 8 * 1024 * 1024))
    assert large > 20 * small
    assert NVLINK.collective_ms("all_reduce", 8 * 1024 * 1024, 8) < large


def test_mla_decode_attention_grows_with_context_and_with_query_heads():
    short, long = (PCIE.mla_generation_ms(32, 8, ctx) for ctx in (1024, 16384))
    assert long > 2 * short
    one, eight = (PCIE.mla_generation_ms(32, 8 * q, 4096) for q in (1, 8))
    assert eight > one


def test_every_catalog_gpu_with_tables_names_a_system_the_package_has():
    for gpu in ("rtx-pro-6000-server", "h100-sxm", "h200-sxm", "b200-sxm"):
        hw = load_hardware(gpu)
        assert tables_for(hw.measured_system, "sglang") is not None, gpu
        assert tables_for(hw.measured_system, "vllm").engine == "vllm"
    assert load_hardware("rtx-pro-6000-workstation").measured_system == ""


# --- the interpolator itself -----------------------------------------------------------------


def test_grid_interpolates_multilinearly_and_skips_unmeasured_corners():
    points = np.array([[1, 1], [1, 3], [3, 1], [3, 3]], dtype=float)
    grid = Grid.from_rows(points, np.array([1.0, 3.0, 5.0, 7.0]))
    assert grid.at((2, 2)) == pytest.approx(4.0)
    assert grid.at((1, 2)) == pytest.approx(2.0)
    holed = Grid.from_rows(points[:3], np.array([1.0, 3.0, 5.0]))
    assert holed.at((3, 3)) is None
    assert holed.at((2, 1)) == pytest.approx(3.0)


def test_grid_holds_below_the_first_point_and_scales_past_the_last():
    grid = Grid.from_rows(np.array([[2.0], [4.0]]), np.array([1.0, 2.0]))
    assert grid.at((1,)) == pytest.approx(1.0)
    assert grid.at((8,)) == pytest.approx(4.0)
    assert grid.at((8,), held=(0,)) == pytest.approx(2.0)  # a held axis keeps its last value


def test_gqa_query_heads_past_the_widest_timed_add_flops_not_cache_reads():
    # A 16-token verify of Qwen3-8B's 32 heads is 512 query rows over 8 KV heads; B200's
    # SGLang table times up to 128 heads a rank.
    b200 = KernelTables("b200_sxm", "sglang")
    node = Node(load_hardware("b200-sxm"), Efficiency(), b200)
    widest = b200.attention_generation_ms(1, 128, 8, 128, 316)
    assert b200.attention_generation_ms(1, 512, 8, 128, 316) == pytest.approx(widest)
    short = decode_attention(node, 36, 32, 8, 128, 1, 16, 300, Term(0.0, ROOFLINE))
    assert short.ms == pytest.approx(36 * widest)  # short context: the widest timed kernel
    # a window of 256 queries (8,192 rows): their FLOPs at the compute rate are the bound
    flops = 4.0 * 8 * 8192 * (4096 + 256) * 128
    wide = decode_attention(node, 36, 32, 8, 128, 8, 256, 4096, Term(0.0, ROOFLINE))
    assert wide.ms == pytest.approx(36 * node.compute_ms(flops, math.inf))
    assert wide.ms > 36 * b200.attention_generation_ms(8, 128, 8, 128, 4352)


# --- the model on the tables -----------------------------------------------------------------


def test_on_measured_kernels_dflash_wins_at_one_request_and_loses_at_peak_on_the_user_node():
    """The user's node (8x RTX PRO 6000 PCIe, Kimi K2.6, SGLang) priced from its own kernel
    tables: DFlash ahead of plain EP8 at one request and behind it at peak, as measured there,
    and every kernel term of the step read from the tables."""
    from dataclasses import replace

    from backends.perf_model.references import load_reference, model_predictor
    from backends.perf_model.shipped import default_efficiency

    src = load_reference("pcie8_kimi_sglang")
    deployment = replace(src.deployment, measured_kernels=True)
    predict = model_predictor(deployment)
    eff = default_efficiency(deployment.gpu, deployment.engine)
    got = {o.name: predict(eff, o, src.workload) for o in src.observations}
    assert got["EP8 DFlash eager c1"] > got["EP8 graphs c1"]
    assert got["EP8 DFlash eager peak"] < got["EP8 graphs peak"]

    from backends.contract import Workload
    from backends.launch_params import LaunchParams
    from backends.perf_model.backend import PerfModelBackend

    backend = PerfModelBackend(deployment)
    launch = LaunchParams(tp_size=8, ep_size=8, speculative_algorithm="dflash",
                          speculative_dflash_block_size=8)
    [level] = backend.measure(launch, Workload(1024, 512, (16,)))
    for key in ("gemm", "moe", "attention", "comm"):
        assert level.breakdown_source[key] == "measured", key
    assert "measured" in level.breakdown_source["draft"]


def test_with_measured_kernels_the_all_reduce_path_is_priced_from_both_tables():
    """SGLang's own all-reduce and NCCL are both timed on 8 PCIe GPUs: with measured kernels the
    model prices `disable_custom_all_reduce` from them (it differs), the roofline does not."""
    from backends.contract import Workload
    from backends.deployment import Deployment
    from backends.flags import LaunchTarget
    from backends.launch_params import LaunchParams
    from backends.perf_model.backend import PerfModelBackend

    target = LaunchTarget(model_path="/m/t", drafter_path="/m/d")
    workload = Workload(1024, 512, (1, 64))
    for measured in (True, False):
        backend = PerfModelBackend(Deployment(gpu="rtx-pro-6000-server", gpus=8,
                                              model="kimi-k2.6", target=target,
                                              measured_kernels=measured))
        comm = [[level.breakdown_ms["comm"] for level in backend.measure(
            LaunchParams(tp_size=8, disable_custom_all_reduce=off), workload)]
            for off in (False, True)]
        assert (comm[0] != comm[1]) is measured, measured


def test_the_model_prices_a_warm_moe_row_from_the_rows_around_it(kimi):
    """The RTX PRO 6000's L2 is in the catalog: with their group scales (4.5 bits a weight)
    Kimi's 2- and 4-token TP8 experts (50 and 99 MB a rank) beat the memory's rate, so 4 tokens
    are priced between the 1- and 8-token rows; the H200's L2 is not, so its rows all stand."""
    roofline = lambda skew: Term(1.0, ROOFLINE, 0.5)  # noqa: E731
    shape = dict(hidden=7168, inter=2048, top_k=8, experts=384, moe_tp=8, moe_ep=1,
                 dtype="int4_wo", distribution="power_law_1.01")
    pcie = Node(load_hardware("rtx-pro-6000-server"), Efficiency(), PCIE, "sglang")
    one, eight = PCIE.moe_ms(1, **shape), PCIE.moe_ms(8, **shape)
    cold = experts(pcie, kimi, 4, 8, 1, roofline)
    assert cold.source == MEASURED
    assert cold.ms == pytest.approx((one + (eight - one) * 3 / 7) * kimi.num_moe_layers)
    assert experts(pcie, kimi, 8, 8, 1, roofline).ms == pytest.approx(
        eight * kimi.num_moe_layers)
    h200 = Node(load_hardware("h200-sxm"), Efficiency(), NVLINK, "sglang")
    assert experts(h200, kimi, 4, 8, 1, roofline).ms == pytest.approx(
        NVLINK.moe_ms(4, **shape) * kimi.num_moe_layers)
