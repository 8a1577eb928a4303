"""The engine and the HTTP front end in two processes (bridge.py, client.py, front.py).

First the two ends of the pipe in this process (a real EngineLoop on the tiny pair behind a real
multiprocessing Pipe, the app on an EngineClient), so a failure can be injected into the engine's
batch; then a real `dflash-tune serve`: killing either process takes the other down, leaves no
process behind and frees the port."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import socket
import sys
import time

import httpx
import psutil
import pytest
from starlette.testclient import TestClient

from backends.contract import FailureClass
from backends.dflash_server.app import build_app
from backends.dflash_server.bridge import EngineBridge
from backends.dflash_server.client import ENGINE_LOST, EngineClient
from backends.dflash_server.launch import ServeOptions, build_loop, server_info
from backends.dflash_server.loop import MAX_FAILED_ROUNDS, Ticket
from backends.failure_log import classify
from backends.launch_cli import engine_params
from backends.server import ServerSpec, free_port, launched
from dflash_core import SamplingParams
from dflash_core.training.evaluate import held_out_prompts
from dflash_core.training.pair import ensure_pair

PAIR = ensure_pair()
PROMPTS = [p[:20] for p in held_out_prompts(PAIR)[:3]]
OPTIONS = ServeOptions(PAIR / "target", PAIR / "drafter",
                       engine_params(PAIR / "drafter", max_running_requests=2), max_context=256)


class _Split:
    """Both ends of the pipe in this process; `lost` counts the client's on_lost calls."""

    def __init__(self) -> None:
        ours, theirs = multiprocessing.Pipe()
        self.bridge = EngineBridge(ours)
        self.loop = build_loop(OPTIONS, after_round=self.bridge.after_round)
        self.info = server_info(OPTIONS)
        self.lost: list[int] = []
        self.client = EngineClient(theirs, self.info, on_lost=lambda: self.lost.append(1))
        self.bridge.start(self.loop)
        self.loop.start()
        self.client.start()

    def close(self) -> None:
        self.loop.stop()
        self.bridge.conn.close()

    def alone(self, prompt: list[int], n: int) -> list[int]:
        return self.loop.engine.generate([prompt], SamplingParams(max_tokens=n),
                                         self.loop.spec).tokens[0]


@pytest.fixture
def split():
    ends = _Split()
    yield ends
    ends.close()


def _body(prompt, **extra) -> dict:
    return {"prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": True, **extra}


def _metric(client, name: str) -> float:
    lines = [line for line in client.get("/metrics").text.splitlines() if line.startswith(name)]
    return float(lines[0].split()[1])


def test_across_the_pipe_replies_are_the_engines_tokens_and_the_gauges_settle(split):
    with TestClient(build_app(split.client, split.info)) as client:
        reply = client.post("/v1/completions", json=_body(PROMPTS[0])).json()
        with client.stream("POST", "/v1/completions",
                           json=_body(PROMPTS[1], stream=True)) as streamed:
            chunks = [line for line in streamed.iter_lines() if line.startswith("data: {")]
        assert _metric(client, "dflash_num_requests_running") == 0
        assert _metric(client, "dflash_num_requests_waiting") == 0
        assert _metric(client, "dflash_generated_tokens_total") == 20
    decode = split.info.tokenizer.decode
    assert reply["choices"][0]["text"] == decode(split.alone(PROMPTS[0], 10))
    assert len(chunks) > 1  # streamed round by round, not at the end


def test_across_the_pipe_a_round_that_raises_fails_its_request_and_the_engine_goes_on(
        split, monkeypatch):
    real, calls = split.loop.batch.step, []

    def fails_first():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected round failure")
        return real()

    monkeypatch.setattr(split.loop.batch, "step", fails_first)
    with TestClient(build_app(split.client, split.info)) as client:
        failed = client.post("/v1/completions", json=_body(PROMPTS[0]))
        assert failed.status_code == 500 and "injected round failure" in failed.text
        assert client.get("/health").json() == {"status": "ok"}
        good = client.post("/v1/completions", json=_body(PROMPTS[0])).json()
    assert good["choices"][0]["text"] == split.info.tokenizer.decode(split.alone(PROMPTS[0], 10))


def test_across_the_pipe_rounds_failing_in_a_row_make_health_report_the_dead_engine(
        split, monkeypatch):
    monkeypatch.setattr(split.loop.batch, "step", lambda: (_ for _ in ()).throw(
        RuntimeError("device lost")))
    with TestClient(build_app(split.client, split.info)) as client:
        for _ in range(MAX_FAILED_ROUNDS):
            assert client.post("/v1/completions", json=_body(PROMPTS[0])).status_code == 500
        health = client.get("/health")
        assert health.status_code == 503 and "rounds in a row" in health.json()["error"]
        assert client.post("/v1/completions", json=_body(PROMPTS[0])).status_code == 503
    assert split.lost == []  # the engine process is alive; only its loop has stopped


async def _until_finished(ticket: Ticket) -> list:
    events = []
    while not events or events[-1].finish is None:
        events.append(await asyncio.wait_for(ticket.events.get(), 30))
    return events


def test_a_cancelled_ticket_frees_its_row_in_the_engine(split):
    async def main():
        running = asyncio.get_running_loop()
        long = Ticket(PROMPTS[0], SamplingParams(max_tokens=4000), running)
        split.client.submit(long)
        await long.events.get()  # admitted: its first tokens came back
        assert split.loop.counters.running == 1
        long.cancel()
        short = Ticket(PROMPTS[1], SamplingParams(max_tokens=4), running)
        split.client.submit(short)
        return await _until_finished(short)

    events = asyncio.run(main())
    assert [t for e in events for t in e.tokens] == split.alone(PROMPTS[1], 4)
    deadline = time.monotonic() + 10
    while split.loop.counters.running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert split.loop.counters.running == 0


def _hang_up(conn) -> None:
    """Shut the socket down: closing the fd alone would wait for the bridge's blocked read."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:  # shuts down the shared socket
        sock.shutdown(socket.SHUT_RDWR)


def test_a_lost_engine_fails_every_waiting_request_and_stops_the_front_end(split):
    async def main():
        ticket = Ticket(PROMPTS[0], SamplingParams(max_tokens=4000),
                        asyncio.get_running_loop())
        split.client.submit(ticket)
        await ticket.events.get()
        split.loop.stop()
        _hang_up(split.bridge.conn)  # as the engine process's death does
        return await _until_finished(ticket)

    events = asyncio.run(main())
    assert events[-1].finish == "error" and events[-1].error == ENGINE_LOST
    deadline = time.monotonic() + 5  # on_lost runs after the clients have heard
    while not split.lost and time.monotonic() < deadline:
        time.sleep(0.01)
    assert split.lost == [1] and split.client.error == ENGINE_LOST
    with pytest.raises(RuntimeError, match=ENGINE_LOST):
        split.client.submit(Ticket(PROMPTS[1], SamplingParams(max_tokens=4), None))


# --- a real server: two processes ---------------------------------------------------------------

def _server(tmp_path, *extra: str) -> ServerSpec:
    port = free_port()
    argv = [sys.executable, "-m", "backends.dflash_server", "--target", str(PAIR / "target"),
            "--drafter", str(PAIR / "drafter"), "--max-running-requests", "2",
            "--max-context", "256", "--port", str(port), *extra]
    # OMP_NUM_THREADS unset (empty), so the server picks its own thread count
    return ServerSpec(argv, port, env={"OMP_NUM_THREADS": ""}, start_timeout_s=120,
                      stop_timeout_s=5, log_path=tmp_path / "server.log")


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _front(pid: int) -> psutil.Process:
    (front,) = [p for p in psutil.Process(pid).children() if "spawn" in " ".join(p.cmdline())]
    return front


@pytest.mark.slow
def test_a_killed_engine_process_takes_the_front_end_with_it(tmp_path):
    spec = _server(tmp_path, "--threads", "2")
    with launched(spec) as server:
        assert "engine on 2 torch threads" in spec.log_path.read_text()
        reply = httpx.post(server.base_url + "/v1/completions", json=_body(PROMPTS[0]),
                           trust_env=False, timeout=60)
        assert reply.status_code == 200
        front = _front(server.pid)
        psutil.Process(server.pid).send_signal(signal.SIGKILL)
        front.wait(timeout=15)  # raises if it is still serving
        assert _port_free(spec.port)


@pytest.mark.slow
def test_a_killed_front_end_takes_the_engine_process_down_as_a_crash(tmp_path):
    spec = _server(tmp_path)
    with launched(spec) as server:
        engine = psutil.Process(server.pid)
        everyone = engine.children(recursive=True)
        _front(server.pid).kill()
        code = engine.wait(timeout=30)
        gone, alive = psutil.wait_procs(everyone, timeout=10)
        assert not alive, alive
        log = spec.log_path.read_text()
        # one core left to the front end (ServeOptions.engine_threads)
        cores = len(os.sched_getaffinity(0))
        assert f"engine on {max(1, cores - 1)} torch threads" in log
        assert "front-end process exited" in log
        assert code != 0 and classify(code, log) is FailureClass.CRASH
        assert _port_free(spec.port)
