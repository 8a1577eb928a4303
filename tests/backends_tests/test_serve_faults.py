"""One request must never take the engine loop down: an admission, a round or a logprobs
scoring that raises fails the requests it concerns, with an error their clients see, and the
loop, its gauges and every other request go on (real engine thread and shipped pair)."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.testclient import TestClient

from backends.dflash_server import loop as loop_module
from backends.dflash_server.app import build_app
from backends.dflash_server.launch import ServeOptions, build
from backends.dflash_server.loop import MAX_FAILED_ROUNDS, Ticket
from backends.launch_cli import engine_params
from dflash_core import SamplingParams
from dflash_core.training.evaluate import held_out_prompts
from dflash_core.training.pair import ensure_pair

PAIR = ensure_pair()
PROMPTS = [p[:20] for p in held_out_prompts(PAIR)[:3]]
GREEDY = SamplingParams(max_tokens=10)


def _serve(rows: int = 2):
    loop, info = build(ServeOptions(
        PAIR / "target", PAIR / "drafter",
        engine_params(PAIR / "drafter", max_running_requests=rows), max_context=256))
    loop.start()
    return loop, info


@pytest.fixture(scope="module")
def served():
    loop, info = _serve()
    with TestClient(build_app(loop, info)) as client:
        yield client, loop, info
    loop.stop()


def _unchecked(**values) -> SamplingParams:
    """SamplingParams holding what its checks refuse, as a caller that skipped them would."""
    params = SamplingParams(max_tokens=10)
    for name, value in values.items():
        object.__setattr__(params, name, value)
    return params


def _run_tickets(loop, samplings: list[SamplingParams]) -> list[list]:
    """Submit one ticket per sampling at once -> each one's events, to its final one."""
    async def one(ticket: Ticket) -> list:
        events = []
        while not events or events[-1].finish is None:
            events.append(await asyncio.wait_for(ticket.events.get(), 30))
        return events

    async def main() -> list[list]:
        running = asyncio.get_running_loop()
        tickets = [Ticket(p, s, running) for p, s in zip(PROMPTS, samplings)]
        for ticket in tickets:
            loop.submit(ticket)
        return await asyncio.gather(*(one(t) for t in tickets))

    return asyncio.run(main())


def _alone(loop, prompt) -> list[int]:
    return loop.engine.generate([prompt], GREEDY, loop.spec).tokens[0]


def _idle(loop) -> bool:
    return loop.error is None and (loop.counters.running, loop.counters.waiting) == (0, 0)


@pytest.mark.parametrize("bad", [{"temperature": 1e39}, {"temperature": 1.0, "top_k": 2**64}],
                         ids=["temperature-1e39", "top_k-2**64"])
def test_an_admission_that_raises_fails_only_its_request(served, bad):
    _, loop, _ = served
    failed = loop.counters.failed_requests
    good, refused = _run_tickets(loop, [GREEDY, _unchecked(**bad)])
    assert [t for e in good for t in e.tokens] == _alone(loop, PROMPTS[0])
    assert refused[-1].finish == "error" and "could not admit" in refused[-1].error
    assert loop.counters.failed_requests == failed + 1 and _idle(loop)
    # The rows it touched are clean: the next two requests are exactly their solo outputs.
    again = _run_tickets(loop, [GREEDY, GREEDY])
    assert [[t for e in events for t in e.tokens] for events in again] == [
        _alone(loop, p) for p in PROMPTS[:2]]


def _failing_once(monkeypatch, loop, what: str = "step") -> None:
    real = getattr(loop.batch, what)
    calls = []

    def fails_first(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected round failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(loop.batch, what, fails_first)


def _body(prompt, **extra) -> dict:
    return {"prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": True, **extra}


def test_a_round_that_raises_fails_its_requests_and_the_loop_goes_on(served, monkeypatch):
    client, loop, info = served
    _failing_once(monkeypatch, loop)
    failed = client.post("/v1/completions", json=_body(PROMPTS[0]))
    assert failed.status_code == 500 and "injected round failure" in failed.text
    assert client.get("/health").json() == {"status": "ok"}
    reply = client.post("/v1/completions", json=_body(PROMPTS[0])).json()
    assert reply["choices"][0]["text"] == info.tokenizer.decode(_alone(loop, PROMPTS[0]))
    assert _idle(loop)


def test_a_streamed_request_whose_round_fails_ends_with_an_error_event(served, monkeypatch):
    client, loop, _ = served
    _failing_once(monkeypatch, loop)
    with client.stream("POST", "/v1/completions", json=_body(PROMPTS[1], stream=True)) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2][6:])["error"]
    assert "injected round failure" in error["message"] and error["code"] == 500
    assert _idle(loop)


def test_logprobs_that_fail_fail_only_that_request(served, monkeypatch):
    client, loop, _ = served

    class Broken:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("scratch cache exhausted")

    monkeypatch.setattr(loop_module, "Scorer", Broken)
    bad = client.post("/v1/completions", json=_body(PROMPTS[2], logprobs=1))
    assert bad.status_code == 500 and "scratch cache exhausted" in bad.text
    good = client.post("/v1/completions", json=_body(PROMPTS[2])).json()
    assert good["usage"]["completion_tokens"] == 10 and _idle(loop)


def test_rounds_failing_in_a_row_stop_the_loop_and_every_client_hears_it(monkeypatch):
    loop, info = _serve(rows=1)
    monkeypatch.setattr(loop.batch, "step", lambda: (_ for _ in ()).throw(
        RuntimeError("device lost")))
    try:
        with TestClient(build_app(loop, info)) as client:
            for _ in range(MAX_FAILED_ROUNDS):
                assert client.post("/v1/completions", json=_body(PROMPTS[0])).status_code == 500
            health = client.get("/health")
            assert health.status_code == 503 and "rounds in a row" in health.json()["error"]
            assert client.post("/v1/completions", json=_body(PROMPTS[0])).status_code == 503
            assert (loop.counters.running, loop.counters.waiting) == (0, 0)
    finally:
        loop.stop()
