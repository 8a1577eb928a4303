"""`dflash-tune run --backend vllm` end to end against real vLLM processes on the CPU: a
launch-aware study over plain vs DFlash, the winner gated against vLLM's own plain baseline, and
`best --emit-flags` printing a command that starts a vLLM that answers."""

from __future__ import annotations

import json
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from vllm_helpers import PAIR, server_processes

from backends import vllm_cpu
from backends.server import ServerSpec, free_port, launched

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]


def _config(folder: Path, python: Path, port: int) -> Path:
    raw = {
        "study": {"name": "tiny-vllm", "storage": f"sqlite:///{folder / 'results.db'}",
                  "seed": 0},
        "hardware": {"gpus": 1},
        "model": {"name": str(PAIR / "target" / "config.json"), "path": str(PAIR / "target")},
        "drafter": {"path": str(PAIR / "drafter"), "block_size": 8, "num_layers": 1,
                    "target_layers": [1, 3, 4], "num_heads": 6, "num_kv_heads": 2,
                    "head_dim": 32, "intermediate_size": 576},
        "workload": {"input_len": 32, "output_len": 32, "concurrency": [1, 4],
                     "target_concurrency": 4, "sla": []},
        "backend": {"name": "vllm", "engine": "vllm", "device": "cpu", "kv_cache_gib": 1,
                    "context_length": 256, "port": port,
                    "launcher": list(vllm_cpu.launcher(python)),
                    "env": vllm_cpu.environment(python.parents[1])},
        "search_space": "tiny_pair_vllm",
        "tuning": {"strategy": "launch_aware", "launches": 5, "per_round": 2, "finalists": 1,
                   "repeats": 2, "screen_samples": 50,
                   "gates": {"probe_prompts": 4, "probe_tokens": 16, "soak_s": 2.0}},
    }
    path = folder / "tuner.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _cli(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def _rows(folder: Path, query: str) -> list[tuple]:
    with sqlite3.connect(folder / "results.db") as db:
        return db.execute(query).fetchall()


def test_a_launch_aware_vllm_study_gates_its_winner_and_best_relaunches_it(tmp_path, vllm_python):
    port = free_port()
    config = _config(tmp_path, vllm_python, port)
    run = _cli("run", "-c", str(config), cwd=tmp_path, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "probe skipped" not in run.stderr and "random token ids" not in run.stderr
    assert server_processes() == []

    trials = _rows(tmp_path, "select trial_number, params_json, status, log_excerpt from "
                   "dflash_tune_trials order by trial_number")
    assert json.loads(trials[0][1])["speculative_algorithm"] == "none"  # the baseline first
    accept = _rows(tmp_path, "select t.params_json, m.accept_len_mean from "
                   "dflash_tune_measurements m join dflash_tune_trials t on "
                   "t.trial_number = m.trial_number where t.status = 'ok'")
    dflash = [a for params, a in accept if json.loads(params)["speculative_algorithm"] != "none"]
    # Run-local, from vLLM's own spec-decode counters, on the pair's held-out prompts.
    assert dflash and min(dflash) > 1.5
    gated = [json.loads(p) for _, p, status, excerpt in trials
             if excerpt == "gates passed" and status == "ok"]
    assert gated  # the losslessness probe against vLLM's plain outputs, acceptance and a soak

    best = _cli("best", "-c", str(config), "--emit-flags", "--backend", "vllm", cwd=tmp_path,
                timeout=120)
    assert best.returncode == 0, best.stderr
    argv = shlex.split(best.stdout)
    assert argv[0] == "env" and "--port" in argv and argv[argv.index("--port") + 1] == str(port)
    # As printed: `env LD_PRELOAD=... <venv python> -m vllm.entrypoints.openai.api_server ...`
    with launched(ServerSpec(argv, port, start_timeout_s=600, stop_timeout_s=30)) as server:
        reply = httpx.post(f"{server.base_url}/v1/completions", timeout=120, json={
            "model": str(PAIR / "target"), "prompt": [1, 2, 3], "max_tokens": 4,
            "temperature": 0, "ignore_eos": True})
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4
    assert server_processes() == []
