"""A real `dflash-tune serve` process (the shipped tiny pair, 1,024 open files) under hostile
clients: a 30 MB body, a 10 MB prompt, a 2 MB stop list and ~1,100 half-open connections at once
leave /health fast, the memory bounded, the log short and the greedy output unchanged; a body
that trickles is a 408, a connection that sends no headers is closed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from backends.server import ServerSpec, free_port, launched
from dflash_core.training.evaluate import held_out_prompts
from dflash_core.training.pair import ensure_pair

PAIR = ensure_pair()
PROMPT = held_out_prompts(PAIR)[0][:24]
OPEN_FILES = 1024
HALF_OPEN = 1100
TIMEOUT_S = 3  # --header-timeout and --body-timeout
# Runs the server with a low open-file limit (its front end inherits it), as a small host would.
LIMITED = (f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, "
           f"({OPEN_FILES}, {OPEN_FILES})); os.execv(sys.executable, [sys.executable, '-m', "
           "'backends.dflash_server', *sys.argv[1:]])")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    port = free_port()
    argv = [sys.executable, "-c", LIMITED, "--target", str(PAIR / "target"),
            "--drafter", str(PAIR / "drafter"), "--method", "dflash",
            "--max-running-requests", "2", "--max-context", "4096", "--port", str(port),
            "--header-timeout", str(TIMEOUT_S), "--body-timeout", str(TIMEOUT_S)]
    spec = ServerSpec(argv, port, start_timeout_s=120, stop_timeout_s=10,
                      log_path=folder / "server.log")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DFLASH_TUNE_RUN_DIR", str(folder / "run"))
        with launched(spec) as server:
            yield server


def _client(server) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, timeout=30, trust_env=False)


def _greedy(server) -> dict:
    with _client(server) as client:
        reply = client.post("/v1/completions", json={
            "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    return reply.json()


def _address(server) -> tuple[str, int]:
    host, port = server.base_url.removeprefix("http://").split(":")
    return host, int(port)


# /health from a process of its own (this one is busy attacking), each time from a new
# connection (a new client), until stdin closes; prints the latencies as JSON.
POLLER = """
import json, socket, sys, threading, time
host, port = sys.argv[1], int(sys.argv[2])
done, latencies = threading.Event(), []
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.is_set():
    began = time.perf_counter()
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\\r\\nhost: x\\r\\nconnection: close\\r\\n\\r\\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    latencies.append(time.perf_counter() - began)
    time.sleep(0.02)
print(json.dumps(latencies))
"""


def _poller(server) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", POLLER, *map(str, _address(server))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _huge_body(server, size: int = 30 * 2**20) -> bytes:
    """Declare and send a 30 MB body; -> the status line the server answers with."""
    sock = socket.create_connection(_address(server))
    sock.settimeout(20)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                 b"\r\ncontent-length: %d\r\n\r\n" % size)
    try:
        chunk = b"x" * 2**20
        for _ in range(size // len(chunk)):
            sock.sendall(chunk)
    except OSError:  # refused and closed before it was all sent: as it should be
        pass
    try:
        return sock.recv(4096).split(b"\r\n")[0]
    finally:
        sock.close()


def _post(server, body: bytes) -> httpx.Response:
    with _client(server) as client:
        return client.post("/v1/completions", content=body,
                           headers={"content-type": "application/json"})


def _half_open(server, n: int) -> list[socket.socket]:
    """`n` connections that send part of a request's headers and then nothing."""
    socks = []
    for _ in range(n):
        sock = socket.create_connection(_address(server))
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        socks.append(sock)
    return socks


def _front_rss(server) -> int:
    return sum(p.memory_info().rss for p in psutil.Process(server.pid).children(recursive=True))


def test_health_stays_fast_while_hostile_clients_arrive(served):
    before, rss_before = _greedy(served), _front_rss(served)
    # Encoded before the clock starts: this process shares the machine's cores with the server.
    long_prompt = json.dumps({"prompt": "x" * 10_000_000, "max_tokens": 4}).encode()
    many_stops = json.dumps({"prompt": PROMPT, "max_tokens": 256,
                             "stop": ["y" * 1000] * 2000}).encode()
    poller = _poller(served)
    time.sleep(0.5)
    with ThreadPoolExecutor(4) as pool:
        huge = pool.submit(_huge_body, served)
        prompt = pool.submit(_post, served, long_prompt)
        stops = pool.submit(_post, served, many_stops)
        half_open = pool.submit(_half_open, served, HALF_OPEN)
        assert huge.result().startswith(b"HTTP/1.1 413")
        assert prompt.result().status_code == 400
        assert "more than max_context" in prompt.result().json()["error"]["message"]
        assert stops.result().status_code == 400
        assert "at most 16 strings" in stops.result().json()["error"]["message"]
        socks = half_open.result()
        time.sleep(1.0)  # /health among the half-open connections
    latencies = json.loads(poller.communicate("", timeout=30)[0])
    for sock in socks:
        sock.close()
    assert len(latencies) > 10 and max(latencies) < 0.5, sorted(latencies)[-5:]
    assert _front_rss(served) - rss_before < 200 * 2**20
    assert _greedy(served)["choices"] == before["choices"]
    log = served.log_path.read_text()
    assert len(log) < 20_000 and "Traceback" not in log, log[-3000:]
    served.check()


def test_a_connection_that_sends_no_headers_is_closed(served):
    [sock] = _half_open(served, 1)
    sock.settimeout(TIMEOUT_S + 5)
    began = time.monotonic()
    assert sock.recv(100) == b""  # closed by the server
    assert time.monotonic() - began < TIMEOUT_S + 2
    sock.close()


def test_a_body_that_trickles_is_a_408(served):
    sock = socket.create_connection(_address(served))
    sock.settimeout(TIMEOUT_S + 5)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                 b"\r\ncontent-length: 100\r\n\r\n{\"prompt\"")
    answer = b"".join(iter(lambda: sock.recv(4096), b""))  # until the server closes
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within" in answer


def test_a_client_that_leaves_mid_body_logs_no_traceback(served):
    sock = socket.create_connection(_address(served))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                 b"\r\ncontent-length: 1000\r\n\r\n{\"prompt\": [1, 2")
    time.sleep(0.2)
    sock.close()
    time.sleep(0.5)
    assert _greedy(served)["usage"]["completion_tokens"] == 16
    log = served.log_path.read_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]


def test_a_chunked_body_past_the_limit_is_a_413(served):
    def chunks():
        for _ in range(20):
            yield b"x" * 2**20
    with _client(served) as client:
        reply = client.post("/v1/completions", content=chunks())  # no content-length: chunked
    assert reply.status_code == 413 and "larger than this server takes" in reply.text
    assert json.loads(reply.text)["error"]["code"] == 413
