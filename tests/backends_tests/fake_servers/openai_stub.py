"""An OpenAI-compatible streaming server with known timing and acceptance, to test the load
generator against a real process.

    python openai_stub.py --port P [--tokens-per-s R] [--ttft-ms T] [--accept-len K]

Streams ``max_tokens`` one-token chunks: the first ``ttft_ms`` after the request arrived, then
one every ``1 / tokens_per_s`` (on an absolute schedule, so delays do not accumulate). Tokens are
grouped into speculative rounds of ``K`` (a text prompt containing ``accept=K`` overrides it),
counted in the ``dflash_spec_*`` counters of ``/metrics``, split over two ``dp_rank`` label sets.

Debug endpoints, for the tests: ``GET /debug/requests`` (the server's own perf_counter stamps per
request: arrival, first and last token sent; in-flight counts), ``POST /debug/reset`` (forget
requests, keep the metric counters) and ``POST /debug/config`` (change any :class:`Config` field,
e.g. ``{"fail_every": 3}`` so every third request answers HTTP 500).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.responses import PlainTextResponse
from starlette.responses import StreamingResponse
from starlette.routing import Route

ACCEPT_HINT = re.compile(r"accept=(\d+)")


@dataclass
class Config:
    model: str = "stub-model"
    ttft_ms: float = 50.0
    tokens_per_s: float = 200.0
    accept_len: int = 3
    fail_every: int = 0  # every Nth request (by arrival since reset) answers 500; 0: never
    usage: bool = True  # honour stream_options.include_usage (False: clients count chunks)


@dataclass
class State:
    config: Config
    requests: list[dict] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    emitted: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0})  # by dp_rank
    rounds: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0})


STATE = State(Config())


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def _accept_len(body: dict) -> int:
    text = json.dumps(body.get("prompt") or body.get("messages") or "")
    match = ACCEPT_HINT.search(text)
    return int(match.group(1)) if match else STATE.config.accept_len


def _chunk(record: dict, chat: bool, k: int, last: bool) -> dict:
    finish = "length" if last else None
    if chat:
        choice = {"index": 0, "delta": {"content": f" t{k}"}, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": f" t{k}", "logprobs": None, "finish_reason": finish}
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {"id": f"stub-{record['id']}", "object": kind, "model": STATE.config.model,
            "choices": [choice]}


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


async def _tokens(body: dict, record: dict, chat: bool):
    config, rank = STATE.config, record["id"] % 2
    n, accept = int(body.get("max_tokens") or 16), _accept_len(body)
    # Counted here rather than in the handler: a generator that never starts never runs
    # `finally`, and the count would leak.
    STATE.in_flight += 1
    STATE.max_in_flight = max(STATE.max_in_flight, STATE.in_flight)
    record["in_flight_at_start"] = STATE.in_flight
    try:
        if chat:  # servers send the role first, with no text: it must not count as a token
            yield _sse({"id": f"stub-{record['id']}", "object": "chat.completion.chunk",
                        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        first_due = record["arrival_s"] + config.ttft_ms / 1e3
        for k in range(n):
            await _sleep_until(first_due + k / config.tokens_per_s)
            if k % accept == 0:
                STATE.rounds[rank] += 1
            STATE.emitted[rank] += 1
            record["last_token_s"] = time.perf_counter()
            record["first_token_s"] = record["first_token_s"] or record["last_token_s"]
            record["tokens_sent"] += 1
            yield _sse(_chunk(record, chat, k, last=k == n - 1))
        if config.usage and (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": n + 4}
            yield _sse({"id": f"stub-{record['id']}", "choices": [], "usage": usage})
        yield _sse("[DONE]")
    finally:
        STATE.in_flight -= 1


async def _generate(request: Request, chat: bool):
    record = {"id": len(STATE.requests) + 1, "arrival_s": time.perf_counter(), "status": 200,
              "first_token_s": None, "last_token_s": None, "tokens_sent": 0}
    STATE.requests.append(record)
    body = await request.json()
    if STATE.config.fail_every and record["id"] % STATE.config.fail_every == 0:
        record["status"] = 500
        return JSONResponse({"error": {"message": "stub failure", "code": 500}}, status_code=500)
    return StreamingResponse(_tokens(body, record, chat), media_type="text/event-stream")


async def completions(request: Request):
    return await _generate(request, chat=False)


async def chat_completions(request: Request):
    return await _generate(request, chat=True)


async def metrics(request: Request):
    lines = []
    for name, by_rank, help_text in (
            ("dflash_spec_emitted_tokens", STATE.emitted, "Tokens committed by verify rounds."),
            ("dflash_spec_rounds", STATE.rounds, "Verify rounds, one per request per round.")):
        lines += [f"# HELP {name}_total {help_text}", f"# TYPE {name}_total counter"]
        for rank, value in by_rank.items():
            labels = f'model_name="{STATE.config.model}",dp_rank="{rank}"'
            lines += [f"{name}_total{{{labels}}} {float(value)}",
                      f"{name}_created{{{labels}}} 1.7e+09"]  # as prometheus_client adds
    return PlainTextResponse("\n".join(lines) + "\n")


async def debug_requests(request: Request):
    return JSONResponse({"requests": STATE.requests, "in_flight": STATE.in_flight,
                         "max_in_flight": STATE.max_in_flight, "config": asdict(STATE.config)})


async def debug_reset(request: Request):
    STATE.requests.clear()
    STATE.max_in_flight = 0
    return JSONResponse({"ok": True})


async def debug_config(request: Request):
    changes = await request.json()
    unknown = set(changes) - set(asdict(STATE.config))
    if unknown:
        return JSONResponse({"error": f"unknown config fields {sorted(unknown)}"}, status_code=400)
    for key, value in changes.items():
        setattr(STATE.config, key, value)
    return JSONResponse(asdict(STATE.config))


async def health(request: Request):
    return PlainTextResponse("ok")


async def models(request: Request):
    model = {"id": STATE.config.model, "object": "model"}
    return JSONResponse({"object": "list", "data": [model]})


app = Starlette(routes=[
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/metrics", metrics), Route("/health", health), Route("/v1/models", models),
    Route("/debug/requests", debug_requests), Route("/debug/reset", debug_reset, methods=["POST"]),
    Route("/debug/config", debug_config, methods=["POST"]),
])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--tokens-per-s", type=float, default=200.0)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--accept-len", type=int, default=3)
    args = parser.parse_args()
    STATE.config = Config(ttft_ms=args.ttft_ms, tokens_per_s=args.tokens_per_s,
                          accept_len=args.accept_len)
    # backlog: the 256-way test opens that many connections at once.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                backlog=2048)


if __name__ == "__main__":
    main()
