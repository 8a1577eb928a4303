"""Several ``dflash-tune run`` workers on one launch-aware study: every decision made from all the
study's launches, the launch budget never exceeded, a killed or stalled worker's launch planned
again and counted once, and every worker naming the same winner. Real processes on the
simulated node (sleeping a little of each launch's virtual time, so that workers overlap), on
SQLite and on a real PostgreSQL."""

from __future__ import annotations

import re
import signal
from collections import Counter
from pathlib import Path

import sqlalchemy as sa
from cli_helpers import cli
from cli_helpers import write_config
from workers import finished
from workers import records_of
from workers import running_trial_of
from workers import trials_of
from workers import wait_until
from workers import worker

from tuner.budget import WORKER_KEY
from tuner import records
from tuner.config import StudyConfig
from tuner.config import load_config
from tuner.dashboard.report import write_report
from tuner.launches.worker import REFERENCE_KEY
from tuner.study import MEASURED_KEY
from tuner.wiring import truth_screen

STUDY = "pcie8-kimi-sglang"
SIM = {"name": "simulated", "simulation": {
    "noise": 0.15, "launch_s": 180.0, "seed": 3, "acceptance": [0.7], "real_time": 0.001,
    "efficiency": {"bandwidth_efficiency": 0.5, "collective_latency_us": 70.0,
                   "launch_overhead_us": 30.0, "matmul_fixed_us": 0.3}}}
LAUNCHES = 8
TUNING = {"strategy": "launch_aware", "launches": LAUNCHES, "per_round": 2, "finalists": 2,
          "repeats": 2, "screen_samples": 60, "gates": {"soak_s": 0.0}}
WINNER = re.compile(r"gates passed: (.+)")


def _study(folder: Path) -> None:
    # Heartbeats every second: a dead worker's launch is stale after 2 s.
    write_config(folder, backend=SIM, tuning=TUNING, study={"heartbeat_s": 1})


def _worker(folder: Path, url: str, delay_s: float, *args: str):
    return worker(folder, url, delay_s, *args, backend="simulated")


def _assert_one_study(url: str, errs: list[str]) -> list:
    """Within budget, one record per measured launch, nothing left running, one winner."""
    trials, recorded = trials_of(url, STUDY), records_of(url, STUDY)
    assert "RUNNING" not in {t.state.name for t in trials}
    measured = [t for t in trials if t.user_attrs.get(MEASURED_KEY)]
    assert set(recorded) == {t.number for t in measured} and len(recorded) <= LAUNCHES
    [base] = [t for t in measured if t.user_attrs.get(REFERENCE_KEY)]  # one baseline
    assert base.params["speculative_algorithm"] == "none"
    winners = {WINNER.search(err).group(1) for err in errs}
    assert len(winners) == 1, winners
    gated = [t for t in measured if t.user_attrs.get("gated")]
    assert len(gated) == len({str(t.params) for t in gated})  # the gates ran once per leader
    return measured


def _workers_share_one_study(folder: Path, url: str, n: int) -> None:
    _study(folder)
    # A guard against a hang, not a speed check: three workers share two cores in CI.
    errs = [finished(w, timeout=300) for w in [_worker(folder, url, 0.0) for _ in range(n)]]
    measured = _assert_one_study(url, errs)
    by_worker = Counter(t.user_attrs[WORKER_KEY] for t in measured)
    assert len(by_worker) == n, by_worker  # every worker measured: the study was shared
    shown = rf"{len(measured)}/{LAUNCHES}\s+running 0, left {LAUNCHES - len(measured)}"
    for err in errs:  # each worker's progress counted every worker's launches
        assert re.search(shown, err), err
    # The report says which worker measured each launch.
    page = write_report(StudyConfig(storage=url).storage, STUDY, folder / "r.html").read_text()
    row = re.search(r"<th>measured by</th><td>(.*?)</td>", page).group(1)
    for name in by_worker:
        numbers = " ".join(f"#{t.number}" for t in measured if t.user_attrs[WORKER_KEY] == name)
        assert f"{name}: {numbers}" in row


def test_two_sqlite_workers_share_one_launch_aware_study(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    _workers_share_one_study(tmp_path, url, 2)
    # One worker alone on the same node and seed chooses no better than the two did.
    finished(_worker(tmp_path, url, 0.0, "--study", "alone"), timeout=120)
    cfg = load_config(tmp_path / "tuner.yaml")
    truth, engine = truth_screen(cfg, samples=10), records.connect(url)
    shared, alone = (truth.predict(records.load_winner(engine, s)).goodput
                     for s in (STUDY, "alone"))
    assert shared >= 0.95 * alone, (shared, alone)


def test_three_postgres_workers_share_one_launch_aware_study(pg, tmp_path):
    _workers_share_one_study(tmp_path, pg.create_database("three_launch_workers"), 3)


def test_a_killed_workers_launch_is_planned_again_and_counted_once(pg, tmp_path):
    url = pg.create_database("killed_launch_worker")
    _study(tmp_path)
    victim = _worker(tmp_path, url, 600.0)  # its first launch (the baseline) hangs
    dead = running_trial_of(victim, url, STUDY)
    survivor = _worker(tmp_path, url, 0.0)
    wait_until(lambda: records_of(url, STUDY))  # the survivor explores while the baseline runs
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=10)
    err = finished(survivor, timeout=120)
    measured = _assert_one_study(url, [err])
    trials = trials_of(url, STUDY)
    assert trials[dead.number].state.name == "FAIL"
    assert dead.number not in records_of(url, STUDY)
    # The baseline, launched again by the survivor after launches of its own.
    [base] = [t for t in measured if t.user_attrs.get(REFERENCE_KEY)]
    assert base.number > dead.number and measured[0].number < base.number


def test_a_stalled_workers_late_result_is_dropped(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    _study(tmp_path)
    stalled = _worker(tmp_path, url, 0.3)  # each level 0.3 s: a launch takes seconds
    late = running_trial_of(stalled, url, STUDY)
    stalled.send_signal(signal.SIGSTOP)  # frozen: no heartbeat
    other = _worker(tmp_path, url, 0.0)
    wait_until(lambda: any(t.state.name == "FAIL" for t in trials_of(url, STUDY)))
    wait_until(lambda: records_of(url, STUDY))  # the other worker goes on meanwhile
    stalled.send_signal(signal.SIGCONT)
    errs = [finished(other, timeout=120), finished(stalled, timeout=120)]
    assert f"launch {late.number} went stale while it ran" in errs[1]
    _assert_one_study(url, errs)
    assert late.number not in records_of(url, STUDY)


def test_a_worker_on_other_hardware_or_engine_is_refused_with_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    _study(tmp_path)
    first = _worker(tmp_path, url, 600.0)  # the study's worker, inside its first launch
    running_trial_of(first, url, STUDY)
    other = tmp_path / "other"
    other.mkdir()
    write_config(other, backend={**SIM, "engine": "vllm"}, tuning=TUNING,
                 hardware={"gpu": "h200-sxm"})
    result = cli("run", "-c", str(other / "tuner.yaml"), "--storage", url, cwd=other)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=10)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "was run with other settings" in line and "hardware.gpu" in line
    assert "backend.engine" in line
    assert len(trials_of(url, STUDY)) == 1  # the refused worker launched nothing


def test_a_study_whose_launches_carry_no_baseline_mark_keeps_its_first_as_baseline(tmp_path):
    """A study recorded by an earlier version (no launch marked as the baseline): its first
    launch is the baseline, so resuming it launches no second one."""
    url = f"sqlite:///{tmp_path / 'results.db'}"
    _study(tmp_path)
    first = _worker(tmp_path, url, 0.3)
    running_trial_of(first, url, STUDY)
    wait_until(lambda: records_of(url, STUDY))  # the baseline recorded
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=10)
    with records.connect(url).begin() as conn:
        unmarked = conn.execute(sa.text("DELETE FROM trial_user_attributes WHERE key = :k"),
                                {"k": REFERENCE_KEY}).rowcount
    assert unmarked == 1
    finished(_worker(tmp_path, url, 0.0), timeout=120)
    # Judged by the records, as the workers judge: the kill may land after the baseline's
    # record and before its trial is marked measured.
    trials = {t.number: t for t in trials_of(url, STUDY)}
    assert trials[min(records_of(url, STUDY))].params["speculative_algorithm"] == "none"
    assert not any(t.user_attrs.get(REFERENCE_KEY) for t in trials.values())
