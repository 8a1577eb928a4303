"""End to end on CPU: `dflash-tune run --backend serve` launches real `dflash-tune serve`
processes with the tiny trained pair, stores what it measured, `best --emit-flags` prints a
command that starts that server again, and Ctrl-C mid-load leaves nothing behind."""

from __future__ import annotations

import json
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import yaml
from cli_helpers import cli

from backends.server import ServerSpec, free_port, group_alive, launched
from dflash_core.training.pair import ensure_pair

PAIR = ensure_pair()


def _config(folder: Path, trials: int, output_len: int = 16) -> Path:
    raw = {
        "study": {"name": "tiny-serve", "storage": f"sqlite:///{folder / 'results.db'}",
                  "n_trials": trials, "seed": 0, "sampler": "random"},
        "hardware": {"gpus": 1},
        "model": {"name": str(PAIR / "target" / "config.json"), "path": str(PAIR / "target")},
        "drafter": {"path": str(PAIR / "drafter"), "block_size": 8, "num_layers": 1,
                    "target_layers": [1, 3, 4], "num_heads": 6, "num_kv_heads": 2,
                    "head_dim": 32, "intermediate_size": 576},
        "workload": {"input_len": 32, "output_len": output_len, "concurrency": [1, 4],
                     "target_concurrency": 4, "sla": []},
        "backend": {"name": "serve", "engine": "dflash", "context_length": 256},
        "search_space": "tiny_pair",
        # One run per configuration is enough here: this test is about real launches, the
        # re-measurement rules have their own tests.
        "tuning": {"repeats": 1},
    }
    path = folder / "tuner.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _rows(folder: Path, query: str) -> list[tuple]:
    with sqlite3.connect(folder / "results.db") as db:
        return db.execute(query).fetchall()


def test_a_serve_study_measures_real_servers_and_best_relaunches_the_winner(tmp_path):
    config = _config(tmp_path, trials=3)
    run = cli("run", "-c", str(config), cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    trials = _rows(tmp_path, "select trial_number, status, params_json, log_excerpt from "
                   "dflash_tune_trials")
    # Samples the space's constraints reject are kept as such, never launched.
    rejected = [t for t in trials if t[1] == "invalid_config"]
    assert all(excerpt.startswith("violates ") for *_, excerpt in rejected)
    trials = [t[:3] for t in trials if t not in rejected]
    assert [status for _, status, _ in trials] == ["ok"] * 3
    accept = _rows(tmp_path, "select t.params_json, m.concurrency, m.accept_len_mean from "
                   "dflash_tune_measurements m join dflash_tune_trials t on "
                   "t.trial_number = m.trial_number")
    speculative = [a for params, _, a in accept
                   if json.loads(params)["speculative_algorithm"] != "none"]
    # Seeded: after the enqueued baseline the random sampler draws speculative trials.
    assert len(speculative) >= 2 and min(speculative) > 1.0

    best = cli("best", "-c", str(config), "--emit-flags", cwd=tmp_path)
    assert best.returncode == 0, best.stderr
    argv = shlex.split(best.stdout)
    assert argv[:2] == ["dflash-tune", "serve"]
    port = free_port()
    argv[argv.index("--port") + 1] = str(port)
    with launched(ServerSpec([sys.executable, "-m", "tuner", *argv[1:]], port,
                             start_timeout_s=120)) as server:
        reply = httpx.post(f"{server.base_url}/v1/completions", timeout=60, json={
            "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0, "ignore_eos": True})
        assert reply.json()["usage"]["completion_tokens"] == 4


def test_ctrl_c_during_a_load_level_stops_cleanly_and_leaves_no_server(tmp_path):
    config = _config(tmp_path, trials=20, output_len=400)
    run = subprocess.Popen([sys.executable, "-m", "tuner", "run", "-c", str(config)],
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        server = _wait_for_serving_child(run.pid)
        pgid = server.pid  # the server leads its own process group
        time.sleep(1.0)  # inside a load level
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, err
    assert "interrupted" in err
    assert not group_alive(pgid)
    assert not psutil.pid_exists(server.pid) or server.status() == psutil.STATUS_ZOMBIE


def _wait_for_serving_child(pid: int, timeout_s: float = 120) -> psutil.Process:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in psutil.Process(pid).children(recursive=True):
            try:
                cmd = proc.cmdline()
            except psutil.NoSuchProcess:
                continue
            if "backends.dflash_server" in cmd and "--port" in cmd and _healthy(cmd[cmd.index("--port") + 1]):
                return proc
        time.sleep(0.05)
    raise AssertionError("no serving child appeared")


def _healthy(port: str) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_launch_that_fails_is_recorded_with_its_class_and_the_study_goes_on(tmp_path):
    space = {"name": "oom_or_not", "context": {"gpus": "devices"},
             "params": {"tp_size": {"type": "categorical", "choices": [1]},
                        "speculative_algorithm": {"type": "categorical", "choices": ["none"]},
                        "cuda_graph": {"type": "categorical", "choices": [False]},
                        # 10^9 rows of KV cache cannot fit: the server refuses them, as OOM.
                        "max_running_requests": {"type": "categorical",
                                                 "choices": [4, 1_000_000_000]}}}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    config = _config(tmp_path, trials=3)
    raw = yaml.safe_load(config.read_text())
    raw["search_space"] = str(tmp_path / "space.yaml")
    raw["study"]["seed"] = 1
    config.write_text(yaml.safe_dump(raw))
    run = cli("run", "-c", str(config), cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    statuses = _rows(tmp_path, "select status from dflash_tune_trials order by trial_number")
    assert {"oom", "ok"} <= {s for (s,) in statuses} and len(statuses) == 3
    excerpt = _rows(tmp_path, "select log_excerpt from dflash_tune_trials where status = 'oom'")
    assert "GB are free: lower the running requests" in excerpt[0][0]


def test_a_launch_aware_serve_study_gates_its_winner_against_the_baseline(tmp_path):
    """Real servers end to end: the baseline's greedy outputs are the reference, the winner's
    last launch reproduces them (lossless), its drafter accepts > 1 token per round, and `best`
    names it only after re-measurement."""
    config = _config(tmp_path, trials=1)
    raw = yaml.safe_load(config.read_text())
    raw["tuning"] = {"strategy": "launch_aware", "launches": 5, "per_round": 2,
                     "finalists": 1, "repeats": 2, "screen_samples": 50,
                     "gates": {"probe_prompts": 4, "probe_tokens": 12, "soak_s": 1.0}}
    config.write_text(yaml.safe_dump(raw))
    run = cli("run", "-c", str(config), cwd=tmp_path, timeout=400)
    assert run.returncode == 0, run.stderr
    assert "probe skipped" not in run.stderr
    trials = _rows(tmp_path, "select params_json, status, log_excerpt from dflash_tune_trials "
                   "order by trial_number")
    assert json.loads(trials[0][0])["speculative_algorithm"] == "none"
    gated = [(json.loads(p), s) for p, s, excerpt in trials if excerpt == "gates passed"]
    assert gated and all(s == "ok" for _, s in gated)
    chosen = json.loads(cli("best", "-c", str(config), "--format", "json", cwd=tmp_path).stdout)
    assert chosen["runs"] >= 2 and chosen["params"] in [p for p, _ in gated]
