"""`dflash-tune serve`'s app over the real engine and the shipped pair (Starlette TestClient:
real ASGI app, real engine thread, no socket)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from starlette.testclient import TestClient

from backends.dflash_server.app import build_app
from backends.dflash_server.launch import ServeOptions, build
from backends.launch_cli import engine_params
from dflash_core import SamplingParams
from dflash_core.training.evaluate import held_out_prompts
from dflash_core.training.pair import ensure_pair

PAIR = ensure_pair()
PROMPTS = [p[:24] for p in held_out_prompts(PAIR)[:6]]


@pytest.fixture(scope="module")
def server():
    launch = engine_params(PAIR / "drafter", speculative_algorithm="ddtree",
                           speculative_ddtree_budget=16, max_running_requests=3)
    options = ServeOptions(PAIR / "target", PAIR / "drafter", launch, max_context=256)
    loop, info = build(options)
    loop.start()
    with TestClient(build_app(loop, info)) as client:
        yield client, loop, info
    loop.stop()


def _solo(loop, prompt, n):
    return loop.engine.generate([prompt], SamplingParams(max_tokens=n), loop.spec).tokens[0]


def _complete(client, prompt, n=16, **extra):
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, **extra}
    return client.post("/v1/completions", json=body)


def test_greedy_completion_is_the_engine_output(server):
    client, loop, info = server
    reply = _complete(client, PROMPTS[0]).json()
    assert reply["choices"][0]["text"] == info.tokenizer.decode(_solo(loop, PROMPTS[0], 16))
    assert reply["usage"] == {"prompt_tokens": 24, "completion_tokens": 16, "total_tokens": 40}
    assert reply["choices"][0]["finish_reason"] == "length"


def test_streaming_deltas_add_up_to_the_whole_reply(server):
    client, *_ = server
    whole = _complete(client, PROMPTS[1]).json()["choices"][0]["text"]
    with client.stream("POST", "/v1/completions", json={
            "prompt": PROMPTS[1], "max_tokens": 16, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == whole
    assert chunks[-1]["usage"]["completion_tokens"] == 16
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


def test_concurrent_requests_share_the_batch_and_each_gets_its_own_tokens(server):
    client, loop, info = server
    before = loop.counters.spec_rounds
    with ThreadPoolExecutor(6) as pool:  # more requests than rows: some wait for a free row
        replies = list(pool.map(lambda p: _complete(client, p, 20).json(), PROMPTS))
    for prompt, reply in zip(PROMPTS, replies):
        assert reply["choices"][0]["text"] == info.tokenizer.decode(_solo(loop, prompt, 20))
    assert loop.counters.spec_rounds > before
    assert loop.counters.running == 0 and loop.counters.waiting == 0


def test_metrics_expose_run_local_acceptance_counters(server):
    client, *_ = server
    def scrape():
        text = client.get("/metrics").text
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                if line and not line.startswith("#")}
    before = scrape()
    _complete(client, PROMPTS[2], 32)
    after = scrape()
    rounds = after["dflash_spec_rounds_total"] - before["dflash_spec_rounds_total"]
    emitted = after["dflash_spec_emitted_tokens_total"] - before["dflash_spec_emitted_tokens_total"]
    assert rounds > 0 and emitted / rounds > 1.5  # the trained drafter really drafts
    assert after["dflash_requests_total"] == before["dflash_requests_total"] + 1


def test_chat_health_models_and_bad_requests(server):
    client, *_ = server
    chat = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "def f():"}], "max_tokens": 5}).json()
    assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] <= 5
    assert client.get("/health").json() == {"status": "ok"}
    card = client.get("/v1/models").json()["data"][0]
    assert card["id"] == "target" and card["launch"]["speculative_algorithm"] == "ddtree"
    assert card["launch"]["speculative_ddtree_budget"] == 16
    assert client.post("/v1/completions", json={"prompt": []}).status_code == 400
    assert client.post("/v1/completions", json={"prompt": [1] * 300}).status_code == 400
    assert client.post("/v1/chat/completions", json={"messages": "x"}).status_code == 400
    bad_id = client.post("/v1/completions", json={"prompt": [1, 10**6]})
    assert bad_id.status_code == 400 and "token ids" in bad_id.text
    assert client.get("/health").json() == {"status": "ok"}  # the engine thread lives on


def test_a_client_that_leaves_mid_stream_frees_its_row(server):
    client, loop, _ = server
    before = loop.counters.generated_tokens
    with client.stream("POST", "/v1/completions", json={
            "prompt": PROMPTS[3], "max_tokens": 200, "ignore_eos": True, "stream": True,
            "temperature": 0}) as response:
        next(response.iter_lines())
    deadline = time.monotonic() + 10
    while loop.counters.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loop.counters.running == 0
    # Freed early, not run to its 200 tokens.
    assert loop.counters.generated_tokens - before < 150


@pytest.fixture(scope="module")
def slow_server():
    """Plain decoding with a long context: one request keeps the engine busy for seconds, so
    the check cannot race a request that already finished."""
    loop, info = build(ServeOptions(PAIR / "target", None,
                                    engine_params(max_running_requests=2), max_context=4096))
    loop.start()
    with TestClient(build_app(loop, info)) as client:
        yield client
    loop.stop()


def test_the_drain_check_sees_requests_in_flight_and_an_idle_server(slow_server):
    from backends.drain import busy_requests

    client = slow_server
    with client.stream("POST", "/v1/completions", json={
            "prompt": PROMPTS[4], "max_tokens": 3500, "ignore_eos": True, "stream": True,
            "temperature": 0}) as response:
        # Hold the iterator: a dropped one is closed when the garbage collector gets to it,
        # which disconnects the client and frees the request under the check's feet.
        lines = response.iter_lines()
        next(lines)
        deadline = time.monotonic() + 10  # the engine thread may not have counted it yet
        while not busy_requests(client, "dflash") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert busy_requests(client, "dflash") >= 1
    # Leaving the stream disconnects the client; the engine frees the row at its next round.
    deadline = time.monotonic() + 30
    while busy_requests(client, "dflash") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert busy_requests(client, "dflash") == 0
    assert busy_requests(client, "none") is None  # a flavor without the gauges cannot tell
