"""Stopping a real `dflash-tune serve` process with SIGTERM: it admits nothing new (503), the
stream in flight ends with an error event and `[DONE]` (not a cut connection), and the process
exits 0 with one calm line."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from backends.server import ServerSpec, free_port, launched
from dflash_core.training.evaluate import held_out_prompts
from dflash_core.training.pair import ensure_pair

PAIR = ensure_pair()
PROMPT = held_out_prompts(PAIR)[0][:24]


@pytest.fixture
def served(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_TUNE_RUN_DIR", str(tmp_path / "run"))
    port = free_port()
    argv = [sys.executable, "-m", "backends.dflash_server", "--target", str(PAIR / "target"),
            "--drafter", str(PAIR / "drafter"), "--method", "dflash",
            "--max-running-requests", "2", "--max-context", "4096", "--port", str(port)]
    with launched(ServerSpec(argv, port, start_timeout_s=120, stop_timeout_s=20,
                             log_path=tmp_path / "server.log")) as server:
        yield server


def _stream_lines(base_url: str, started) -> list[str]:
    """A stream that outlives the stop's grace period (4000 tokens): its `data:` lines."""
    body = {"prompt": PROMPT, "max_tokens": 4000, "temperature": 0, "ignore_eos": True,
            "stream": True}
    lines = []
    with httpx.Client(base_url=base_url, timeout=60, trust_env=False) as client, \
            client.stream("POST", "/v1/completions", json=body) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: "):
                lines.append(line.removeprefix("data: "))
                started.set()
    return lines


def _exit_code(server, within_s: float) -> int | None:
    deadline = time.monotonic() + within_s
    while server.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return server.exit_code()


def test_sigterm_refuses_new_requests_ends_streams_cleanly_and_exits_0(served):
    started = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        stream = pool.submit(_stream_lines, served.base_url, started)
        assert started.wait(30)
        os.kill(served.pid, signal.SIGTERM)
        time.sleep(0.5)
        with httpx.Client(base_url=served.base_url, timeout=10, trust_env=False) as client:
            refused = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert refused.status_code == 503 and "shutting down" in refused.text
        lines = stream.result(timeout=30)
    assert lines[-1] == "[DONE]"
    error = json.loads(lines[-2])["error"]
    assert "shutting down" in error["message"] and error["code"] == 503
    assert _exit_code(served, 20) == 0
    log = served.log_path.read_text()
    assert log.rstrip().endswith("dflash-tune serve: stopped"), log[-2000:]
    assert "Traceback" not in log and "exited (code" not in log, log[-2000:]
