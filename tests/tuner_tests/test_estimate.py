"""`dflash-tune estimate`: the model asked about one configuration (real subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from backends.perf_model.shipped import speedup_error
from cli_helpers import cli

ARGS = ("estimate", "--gpu", "b200-sxm", "--gpus", "1", "--model", "qwen3-8b", "--tp", "1",
        "--input-len", "1024", "--output-len", "2048", "--concurrency", "1,4,8,16,32")


def _levels(tmp_path, *extra):
    run = cli(*ARGS, *extra, "--format", "json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)["levels"], run.stderr


def test_estimate_json_has_one_level_per_concurrency_on_stdout(tmp_path):
    levels, stderr = _levels(tmp_path, "--method", "none")
    assert [lv["concurrency"] for lv in levels] == [1, 4, 8, 16, 32]
    for lv in levels:
        assert lv["output_tok_s"] > 0 and lv["tpot_p50_ms"] > 0 and lv["ttft_p50_ms"] > 0
    assert "gemm" in levels[0]["breakdown_ms"] and "gemm" in stderr  # table on stderr
    # The B200 has measured tables: they price the step unless told otherwise.
    assert levels[0]["breakdown_source"]["gemm"] == "measured"
    roofline, _ = _levels(tmp_path, "--method", "none", "--no-measured-kernels")
    assert roofline[0]["breakdown_source"]["gemm"] == "roofline"
    tok_s = [lv["output_tok_s"] for lv in levels]
    assert tok_s == sorted(tok_s)


def test_measured_kernels_price_the_step_from_the_tables_and_follow_the_context(tmp_path):
    """With --measured-kernels every GEMM, attention and collective term of a B200 step comes
    from its measured tables (the breakdown says so), and a longer prompt moves the attention
    term the way the tables do."""
    short, stderr = _levels(tmp_path, "--method", "none", "--measured-kernels")
    long, _ = _levels(tmp_path, "--method", "none", "--measured-kernels", "--input-len", "16384")
    for key in ("gemm", "attention"):
        assert short[-1]["breakdown_source"][key] == "measured", key
        assert 0 < short[-1]["breakdown_sol_pct"][key] <= 100, key
    assert "[measured" in stderr
    assert long[-1]["breakdown_ms"]["attention"] > 4 * short[-1]["breakdown_ms"]["attention"]
    assert long[-1]["breakdown_ms"]["gemm"] == short[-1]["breakdown_ms"]["gemm"]


def test_estimate_dflash_speedup_is_largest_at_concurrency_1(tmp_path):
    plain, _ = _levels(tmp_path, "--method", "none")
    dflash, _ = _levels(tmp_path, "--method", "dflash", "--block-size", "16",
                        "--acceptance-length", "6.5")
    speedup = [d["output_tok_s"] / p["output_tok_s"] for d, p in zip(dflash, plain)]
    assert speedup[0] > 1.0 and speedup[0] > speedup[-1]
    assert all(d["accept_len_mean"] == dflash[0]["accept_len_mean"] for d in dflash)


def test_a_speculative_estimate_is_read_against_its_plain_twin_within_the_models_error(
        tmp_path):
    """The same launch without speculation is priced beside it: a `vs plain` column, and the
    crossover's note with the model's speedup error on published speedups (the shipped fit's)."""
    plain, _ = _levels(tmp_path, "--method", "none")
    args = ("--method", "dflash", "--block-size", "16", "--acceptance-length", "6.5")
    run = cli(*ARGS, *args, "--format", "json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    assert [lv["plain_output_tok_s"] for lv in record["levels"]] == [
        p["output_tok_s"] for p in plain]
    versus = record["speculation_vs_plain"]
    assert [row["speedup"] for row in versus["by_concurrency"]] == [
        lv["output_tok_s"] / lv["plain_output_tok_s"] for lv in record["levels"]]
    assert versus["margin"] == speedup_error(measured_kernels=True) > 0
    # 2.5x and more at every level here: far outside the error, so a verdict and no caveat.
    assert versus["note"] == "speculation beats plain decoding at every measured concurrency"
    assert versus["within_error_from"] is None and versus["caveat"] == ""
    assert ("vs plain: the same launch without speculation; speculation beats plain decoding "
            "at every measured concurrency") in " ".join(run.stderr.split())
    plain_run = cli(*ARGS, "--method", "none", "--format", "json", cwd=tmp_path)
    assert json.loads(plain_run.stdout)["speculation_vs_plain"] is None
    assert "plain_output_tok_s" not in json.loads(plain_run.stdout)["levels"][0]


def test_an_engine_release_with_serial_rounds_prices_their_work_whole(tmp_path):
    """SGLang 0.5.13 runs DFlash rounds on its spec-v1 worker (scheduler waits for the GPU);
    the pinned release overlaps them, hiding most of the round's own work at one request."""
    dflash = ("--method", "dflash", "--block-size", "16", "--acceptance-length", "6.5")
    serial, stderr = _levels(tmp_path, *dflash, "--engine-version", "0.5.13")
    pinned, _ = _levels(tmp_path, *dflash)
    assert "sglang 0.5.13" in " ".join(stderr.split())  # the table says which release it priced
    work = serial[0]["breakdown_ms"]["spec_round"]
    assert work > 1.0  # the shipped constant: milliseconds a round
    assert pinned[0]["breakdown_ms"]["spec_round"] == pytest.approx(0.3 * work)
    assert pinned[0]["output_tok_s"] > 1.1 * serial[0]["output_tok_s"]
    run = cli(*ARGS, *dflash, "--engine-version", "0.5.9", cwd=tmp_path)
    assert run.returncode != 0 and "0.5.9 has no DFLASH" in run.stderr


def test_estimate_eager_is_slower_than_graphs_at_concurrency_1(tmp_path):
    graphs, _ = _levels(tmp_path)
    eager, _ = _levels(tmp_path, "--no-cuda-graphs")
    assert eager[0]["output_tok_s"] < graphs[0]["output_tok_s"]


def test_estimate_table_format_prints_the_table_on_stdout(tmp_path):
    run = cli(*ARGS, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "output tok/s" in run.stdout and "c=32:" in run.stdout  # `> file` keeps it
    assert run.stderr == ""


def test_json_format_keeps_the_table_off_stdout(tmp_path):
    run = cli(*ARGS, "--format", "json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["levels"] and "output tok/s" in run.stderr


@pytest.mark.parametrize("level", ["65537", "1000000000"])
def test_a_level_no_node_can_hold_is_refused_at_once_in_one_line(tmp_path, level):
    started = time.monotonic()
    run = cli(*ARGS[:-1], f"1,{level}", cwd=tmp_path, timeout=30)
    assert time.monotonic() - started < 15  # the cost does not grow with the level
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        f"error: --concurrency levels must be in 1..65536 (concurrent requests a node can "
        f"hold), got {level}"]



def test_estimate_with_tp_not_dividing_gpus_is_a_one_line_error(tmp_path):
    run = cli("estimate", "--gpu", "h200-sxm", "--gpus", "8", "--model", "qwen3-8b", "--tp", "3",
              "--input-len", "10", "--output-len", "10", "--concurrency", "1", cwd=tmp_path)
    assert run.returncode == 2 and "does not divide" in run.stderr


def test_estimate_takes_the_tuning_names_and_keeps_the_old_spellings(tmp_path):
    run = subprocess.run([sys.executable, "-m", "tuner", "estimate", "--help"], cwd=tmp_path,
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    for name in ("--tp-size", "--speculative-algorithm", "--speculative-dflash-block-size",
                 "--speculative-ddtree-budget", "--speculative-ddtree-topk",
                 "--speculative-ddtree-max-depth", "--speculative-ddtree-round-tokens"):
        assert name in run.stdout, name
    tuned, _ = _levels(tmp_path, "--speculative-algorithm", "ddtree",
                       "--speculative-ddtree-budget", "12")
    old, _ = _levels(tmp_path, "--method", "ddtree", "--budget", "12")
    assert tuned == old


def test_estimate_of_a_ddtree_with_the_defaults_prices_the_uncapped_tree(tmp_path):
    uncapped, _ = _levels(tmp_path, "--speculative-algorithm", "ddtree")
    chain, _ = _levels(tmp_path, "--speculative-algorithm", "ddtree",
                       "--speculative-ddtree-topk", "1")
    assert uncapped[0]["accept_len_mean"] > chain[0]["accept_len_mean"]


def test_a_model_config_json_that_is_no_object_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2, 3]")
    run = cli(*ARGS[:6], str(tmp_path / "config.json"), *ARGS[7:], cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'config.json'}: must hold a JSON object of config fields, not a "
        "list"]


@pytest.mark.parametrize("pricing, unpriced", [
    ("--measured-kernels", "nccl_proto"),  # the tables time the custom all-reduce and NCCL's
    ("--no-measured-kernels", "disable_custom_all_reduce, nccl_proto")])
def test_estimate_says_which_knobs_it_prices_at_their_defaults(tmp_path, pricing, unpriced):
    plain, quiet = _levels(tmp_path, pricing)
    tuned, said = _levels(tmp_path, pricing, "--nccl-proto", "LL128",
                          "--disable-custom-all-reduce")
    assert [lv["output_tok_s"] for lv in tuned] == [lv["output_tok_s"] for lv in plain]
    assert f"measured only: {unpriced} priced" in said
    assert "measured only" not in quiet
