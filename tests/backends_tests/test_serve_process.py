"""A real `dflash-tune serve` process (`python -m backends.dflash_server`, the shipped tiny pair,
uvicorn on a socket): the requests that used to kill its engine are refused and it still
answers correctly; a client that disconnects frees its row; it says where it listens, once."""

from __future__ import annotations

import json
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from backends.server import ServerSpec, free_port, launched
from dflash_core.training.evaluate import held_out_prompts
from dflash_core.training.pair import ensure_pair

PAIR = ensure_pair()
PROMPT = held_out_prompts(PAIR)[0][:24]
ROWS = 2


def _spec(tmp_path, *extra: str) -> ServerSpec:
    port = free_port()
    argv = [sys.executable, "-m", "backends.dflash_server", "--target", str(PAIR / "target"),
            "--drafter", str(PAIR / "drafter"), "--method", "dflash",
            "--max-running-requests", str(ROWS), "--max-context", "4096", "--port", str(port),
            *extra]
    return ServerSpec(argv, port, start_timeout_s=120, stop_timeout_s=5,
                      log_path=tmp_path / "server.log")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    spec = _spec(tmp_path_factory.mktemp("serve"), "--log-level", "info")
    with launched(spec) as server, httpx.Client(base_url=server.base_url, timeout=60,
                                                trust_env=False) as client:
        yield server, client


def _greedy(client, **extra) -> dict:
    reply = client.post("/v1/completions", json={
        "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()


def _gauges(client) -> tuple[float, float]:
    values = {line.split()[0]: float(line.split()[1])
              for line in client.get("/metrics").text.splitlines()
              if line and not line.startswith("#")}
    return values["dflash_num_requests_running"], values["dflash_num_requests_waiting"]


HOSTILE = [
    {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 1e39},
    {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 1.0, "top_k": 18446744073709551616},
    {"prompt": [1, 2, 3], "max_tokens": 0},
    {"prompt": [1, 2, 3], "max_tokens": 4, "stream": True, "stream_options": "x"},
]


def test_requests_that_killed_the_engine_are_refused_and_it_still_answers(served):
    server, client = served
    before = _greedy(client)
    # One long request in flight while the hostile ones arrive: it must not notice them.
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(_greedy, client, max_tokens=64)
        for body in HOSTILE:
            reply = client.post("/v1/completions", json=body, timeout=10)
            assert reply.status_code == 400, reply.text
        nan = client.post("/v1/completions", timeout=10, headers={
            "content-type": "application/json"},
            content='{"prompt": [1, 2, 3], "max_tokens": 4, "temperature": NaN}')
        assert nan.status_code == 400 and "temperature" in nan.text
        assert long.result()["usage"]["completion_tokens"] == 64
    assert client.get("/health").json() == {"status": "ok"}
    after = _greedy(client)
    assert after["choices"] == before["choices"] and after["usage"] == before["usage"]
    assert _gauges(client) == (0, 0)
    server.check()  # still the same process


def _abandon(base_url: str, body: dict) -> socket.socket:
    """Send a non-streaming request over a raw socket and keep the socket (close = leave)."""
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    payload = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                 b"\r\ncontent-length: %d\r\n\r\n%s" % (len(payload), payload))
    return sock


def test_a_non_streaming_client_that_disconnects_frees_its_row(served):
    server, client = served
    long = {"prompt": PROMPT, "max_tokens": 4000, "temperature": 0, "ignore_eos": True}
    socks = [_abandon(server.base_url, long) for _ in range(2 * ROWS)]  # rows full, some wait
    deadline = time.monotonic() + 30
    while _gauges(client)[0] < ROWS and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gauges(client)[0] == ROWS
    for sock in socks:
        sock.close()
    # Rows still held would make it wait for their 4000 tokens (18 s here before the fix).
    began = time.monotonic()
    assert _greedy(client, max_tokens=4)["usage"]["completion_tokens"] == 4
    assert time.monotonic() - began < 5
    deadline = time.monotonic() + 10
    while _gauges(client) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gauges(client) == (0, 0)


def test_it_says_where_it_listens_once_and_logs_access_at_info(served):
    server, client = served
    _greedy(client, max_tokens=2)
    log = server.log_path.read_text()
    assert log.count(f"dflash-tune serve: listening on {server.base_url}") == 1
    assert '"POST /v1/completions HTTP/1.1" 200' in log


def test_the_default_log_level_is_quiet_but_for_the_listening_line(tmp_path):
    with launched(_spec(tmp_path)) as server:
        httpx.post(server.base_url + "/v1/completions", trust_env=False, timeout=60,
                   json={"prompt": [1, 2, 3], "max_tokens": 2})
        log = server.log_path.read_text()
    assert log.count(f"dflash-tune serve: listening on {server.base_url}") == 1
    assert "POST /v1/completions" not in log
