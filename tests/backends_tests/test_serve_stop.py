"""Stopping a real `dflash-tune serve` process with SIGTERM: it admits nothing new (503), lets
the stream in flight finish within the grace period, ends one that outlives it with an error
event and `[DONE]` (not a cut connection), and exits 0 with one calm line."""

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
STREAM_TOKENS = 2000  # well past the half second the test waits before it asks again


def _served(tmp_path, monkeypatch, grace_s: float):
    monkeypatch.setenv("DFLASH_TUNE_RUN_DIR", str(tmp_path / "run"))
    port = free_port()
    argv = [sys.executable, "-m", "backends.dflash_server", "--target", str(PAIR / "target"),
            "--drafter", str(PAIR / "drafter"), "--method", "dflash",
            "--max-running-requests", "2", "--max-context", "4096", "--port", str(port),
            "--shutdown-grace", str(grace_s)]
    return launched(ServerSpec(argv, port, start_timeout_s=120, stop_timeout_s=20,
                               log_path=tmp_path / "server.log"))


def _stream_lines(base_url: str, started) -> list[str]:
    """A stream of STREAM_TOKENS tokens: its `data:` lines."""
    body = {"prompt": PROMPT, "max_tokens": STREAM_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True}
    lines = []
    with httpx.Client(base_url=base_url, timeout=120, trust_env=False) as client, \
            client.stream("POST", "/v1/completions", json=body) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: "):
                lines.append(line.removeprefix("data: "))
                started.set()
    return lines


def _stopped_mid_stream(server, ask_again: bool) -> tuple[list[str], httpx.Response | None]:
    """SIGTERM while a stream runs: the stream's lines, and (if `ask_again`) the answer to a
    request sent half a second after the signal."""
    started, refused = threading.Event(), None
    with ThreadPoolExecutor(1) as pool:
        stream = pool.submit(_stream_lines, server.base_url, started)
        assert started.wait(30)
        os.kill(server.pid, signal.SIGTERM)
        if ask_again:
            time.sleep(0.5)
            with httpx.Client(base_url=server.base_url, timeout=10, trust_env=False) as client:
                refused = client.post("/v1/completions",
                                      json={"prompt": PROMPT, "max_tokens": 2})
        return stream.result(timeout=120), refused


def _assert_calm_exit(server) -> None:
    deadline = time.monotonic() + 20
    while server.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.exit_code() == 0
    log = server.log_path.read_text()
    assert log.rstrip().endswith("dflash-tune serve: stopped"), log[-2000:]
    assert "Traceback" not in log and "exited (code" not in log, log[-2000:]


def test_sigterm_refuses_new_requests_and_lets_the_stream_in_flight_finish(tmp_path,
                                                                           monkeypatch):
    with _served(tmp_path, monkeypatch, grace_s=300) as server:
        lines, refused = _stopped_mid_stream(server, ask_again=True)
        assert refused.status_code == 503 and "shutting down" in refused.text
        assert lines[-1] == "[DONE]"
        events = [json.loads(line) for line in lines[:-1]]
        assert not any("error" in event for event in events)
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert sum(len(event["choices"][0]["text"]) > 0 for event in events) > 1
        _assert_calm_exit(server)


def test_a_stream_past_the_grace_period_ends_with_an_error_event_then_done(tmp_path,
                                                                          monkeypatch):
    with _served(tmp_path, monkeypatch, grace_s=0) as server:
        lines, _ = _stopped_mid_stream(server, ask_again=False)
        assert lines[-1] == "[DONE]"
        error = json.loads(lines[-2])["error"]
        assert "shutting down" in error["message"] and error["code"] == 503
        _assert_calm_exit(server)
