"""bench/harness.py: the median and spread of repeats, ratios of runs in turns, the JSON a
benchmark writes, its common options and table."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench"


@pytest.fixture(scope="module")
def harness():
    sys.path.insert(0, str(BENCH))  # as when a benchmark runs from bench/
    try:
        import harness
    finally:
        sys.path.remove(str(BENCH))
    return harness


@pytest.fixture(autouse=True)
def sigterm_kept():
    """`arguments` installs a benchmark's SIGTERM handler; the test process keeps its own."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_stat_reports_the_median_and_the_range_over_the_median(harness):
    s = harness.stat([10.0, 12.0, 8.0, 11.0, 9.0])
    assert s.median == 10.0
    assert s.spread == pytest.approx(0.4)  # (12 - 8) / 10
    assert s.cell() == "10 (40%)"
    assert s.range_cell() == "10.00 (8.00-12.00)"
    assert harness.stat([5.0]).spread == 0.0


def test_turn_ratios_are_per_repeat_not_ratios_of_medians(harness):
    # A machine twice as slow in repeat 2: each repeat's pair still says ours is 1.5x.
    ratios = harness.turn_ratios([150.0, 75.0, 300.0], [100.0, 50.0, 200.0])
    assert ratios.runs == (1.5, 1.5, 1.5) and ratios.spread == 0.0
    with pytest.raises(ValueError):
        harness.turn_ratios([1.0, 2.0], [1.0])


def test_turns_walk_the_repeats_in_turn_order(harness):
    # turn_order itself: tests/backends_tests/test_peer_bench_turns.py
    assert list(harness.turns(["a", "b", "c"], 3)) == [
        (0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "b"), (1, "a"), (2, "b"), (2, "c"), (2, "a")]


def test_samples_time_each_call_after_the_warm_up(harness):
    calls, syncs = [], []
    times = harness.samples(lambda: calls.append(1), repeats=4, warmup=2,
                            sync=lambda: syncs.append(1))
    assert len(times) == 4 and all(t >= 0 for t in times)
    assert len(calls) == 6 and len(syncs) == 5  # once after the warm-up, once per timed call


def test_save_json_writes_the_result_with_the_host(harness, tmp_path):
    out = tmp_path / "r.json"
    harness.save_json(out, {"tok_s": 412.5, "runs": [1, 2], "path": tmp_path})
    written = json.loads(out.read_text())
    assert written["tok_s"] == 412.5 and written["runs"] == [1, 2]
    assert written["path"] == str(tmp_path)
    assert written["host"]["cores"] >= 1 and written["host"]["cpu"]
    assert written["host"]["python"] == ".".join(map(str, sys.version_info[:3]))
    harness.save_json(None, {"x": 1})  # no path asked for: nothing written, no error


def test_common_options_are_json_and_the_defaults_given(harness):
    args = harness.arguments("A bench.\n\nMore.", repeats=3, seed=7).parse_args(["--json", "o"])
    assert (args.json, args.repeats, args.seed) == (Path("o"), 3, 7)
    bare = harness.arguments("A bench.").parse_args([])
    assert vars(bare) == {"json": None}


def test_table_pads_columns_and_prints_none_as_a_dash(harness):
    assert harness.table(["a", "long header"], [[1, None], ["wide cell", 2.5]]).splitlines() == [
        "| a         | long header |",
        "|-----------|-------------|",
        "| 1         | -           |",
        "| wide cell | 2.5         |"]


def test_a_bench_stopped_with_sigterm_removes_its_temporary_folder(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text(textwrap.dedent(f"""
        import sys, tempfile, time
        sys.path.insert(0, {str(BENCH)!r})
        from harness import arguments
        arguments("A bench.").parse_args([])
        folder = tempfile.TemporaryDirectory(prefix="a-bench-")
        print(folder.name, flush=True)
        time.sleep(60)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    folder = Path(proc.stdout.readline().strip())
    assert folder.is_dir()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert not folder.exists()
