"""bench/engine_bench.py runs on CPU with tiny shapes (what CI can run of the GPU harness)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench" / "engine_bench.py"


def _bench(tmp_path, device: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, str(BENCH), "--shapes", "tiny", "--device", device,
                          "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return run, json.loads(out.read_text())


def test_engine_bench_runs_on_cpu_and_reports_every_check(tmp_path):
    run, result = _bench(tmp_path, "cpu")
    assert result["copy_gb_s"] > 0
    verify = result["verify"]
    assert len(verify) == 2 * 2 * 2 * 4  # kernels x contexts x batches x tree sizes
    assert {r["attention"] for r in verify} == {"reference", "fused"}
    assert all(r["vs_decode"] == 1.0 for r in verify if r["nodes"] == 1)
    assert all(r["graph_ms"] is None for r in verify)  # CUDA graphs need a GPU
    assert {r["mode"] for r in result["end_to_end"]} == {"eager"}
    taus = {r["method"]: r["tau"] for r in result["end_to_end"]}
    assert taus["plain"] == 1.0 and taus["dflash b8"] > 3  # the oracle's profile, not noise
    # A calibrated oracle makes the tree accept more than the chain, as with a real drafter.
    assert taus["ddtree b8 budget 64"] > taus["dflash b8"]
    assert "verify" in run.stdout and "speedup" in run.stdout
    # each end-to-end row is logged (and saved) as it is measured, for a run cut short
    assert run.stderr.count("end to end: ") == len(result["end_to_end"])
    # plain vs DFlash at each batch size of the plan, timed while every request runs
    by_batch = {(r["batch"], r["method"]): r for r in result["by_batch"]}
    assert set(by_batch) == {(b, m) for b in (1, 3) for m in ("plain", "dflash b8")}
    assert all(r["rounds"] > 0 and r["mode"] == "eager" for r in by_batch.values())
    for b in (1, 3):
        plain, dflash = by_batch[b, "plain"], by_batch[b, "dflash b8"]
        assert plain["tau"] == 1.0 and dflash["tau"] > 3
        assert dflash["round_vs_plain"] == pytest.approx(
            dflash["ms_per_round"] / plain["ms_per_round"], abs=0.01)
        # the profile's chain tau: 1 + the sum of 0.86^d over the 7 depths of block 8 = 5.0
        assert dflash["speedup_at_profile"] == pytest.approx(
            5.0 / dflash["round_vs_plain"], rel=0.01)
    assert "speedup by batch" in run.stdout and run.stderr.count("batch 3: ") == 2


@pytest.mark.gpu
def test_engine_bench_runs_on_the_gpu(tmp_path):
    _, result = _bench(tmp_path, "cuda")
    assert result["dtype"] == "torch.bfloat16" and result["graph_errors"] == []
    assert all(r["graph_vs_decode"] is not None for r in result["verify"])
    graphed = [r for r in result["end_to_end"] if r["mode"] == "graphs"]
    eager = {r["method"]: r["tau"] for r in result["end_to_end"] if r["mode"] == "eager"}
    assert set(eager) == {r["method"] for r in graphed}
    # The oracle's draws come from the registered generator: replays accept as eager rounds do.
    assert all(abs(r["tau"] - eager[r["method"]]) <= 0.1 * eager[r["method"]] for r in graphed)
    assert all(0 <= r["host_share"] <= 1 for r in graphed)
    assert {r["mode"] for r in result["by_batch"]} == {"graphs"}


def test_a_failing_graph_turns_the_graph_columns_off_and_keeps_the_run():
    sys.path.insert(0, str(BENCH.parent))
    try:
        import engine_bench
        import engine_report
    finally:
        sys.path.remove(str(BENCH.parent))
    engine_bench.GRAPH_ERRORS.clear()
    assert engine_bench.guarded(lambda: 1 / 0, "cuda") is None
    assert engine_bench.GRAPH_ERRORS == ["ZeroDivisionError: division by zero"]
    assert engine_bench.guarded(lambda: 5, "cuda") is None  # off for the rest of the run
    assert engine_bench.guarded(lambda: 5, "cpu") is None  # and never tried without a GPU
    engine_bench.GRAPH_ERRORS.clear()
    assert engine_bench.guarded(lambda: 5, "cuda") == 5
    rows = [{"method": "dflash b16", "mode": "eager", "tok_s": 100.0},
            {"method": "ddtree b16 budget 32", "mode": "eager", "tok_s": 120.0},
            {"method": "ddtree b16 budget 64", "mode": "eager", "tok_s": 90.0},
            {"method": "plain", "mode": "graphs", "tok_s": 50.0}]  # graphs cut short
    assert engine_report.best_ddtree(rows) == {
        "eager": {"method": "ddtree b16 budget 32", "vs_dflash": 1.2}}


def test_kimi_slice_on_cpu_checks_shapes_and_counts_bytes_without_timing(tmp_path):
    out = tmp_path / "kimi.json"
    run = subprocess.run([sys.executable, str(BENCH), "--shapes", "kimi-slice", "--device", "cpu",
                          "--contexts", "1024,16384", "--nodes", "1,8,64", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["dtype"] == "torch.bfloat16" and result["end_to_end"] == []
    rows = {(r["attention"], r["context"], r["nodes"]): r for r in result["verify"]}
    assert len(rows) == 2 * 2 * 3 and all(r["ms"] is None for r in rows.values())
    gb = {key[1:]: r["gb_moved"] for key, r in rows.items() if key[0] == "fused"}
    # 16K more tokens of latents: 15360 x 3 layers x 576 x 2 bytes = 0.053 GB
    assert abs(gb[(16384, 1)] - gb[(1024, 1)] - 0.053) < 0.002
    # more nodes reach more INT4 experts: 8 of 384 at 1 node, ~60 at 8, ~285 at 64
    assert gb[(1024, 1)] < gb[(1024, 8)] < gb[(1024, 64)]
