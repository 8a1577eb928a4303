"""Load generator for OpenAI-compatible streaming servers (SGLang, vLLM, ours).

Per concurrency level: a short warm-up, one open connection per simulated user, a metrics
scrape, ``requests_per_level`` requests, a second scrape for run-local acceptance
(:mod:`backends.spec_metrics`). Closed loop by default: exactly ``concurrency`` in flight (a
user sends its next request as soon as its previous one ends). With ``request_rate``, open loop:
requests arrive as a seeded Poisson process and ``concurrency`` caps how many are in flight; one
that arrives when every user is busy waits for a free one, and that wait is not in its TTFT
(as with ``vllm bench serve --request-rate R --max-concurrency C``).

Each request is timed on the client with ``time.perf_counter`` from just before it is sent:
TTFT to the first streamed chunk that carries text, ITL between such chunks, E2E to the end of
the response body (right after ``data: [DONE]``). A chunk holding several tokens (a speculative round streamed at once) is one ITL
sample, as in ``vllm bench serve``; TPOT uses the exact token count from ``usage``. A request
that fails is recorded with its error and never raised, so every request sent is counted once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import ssl
import sys
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from backends.contract import Measurement
from backends.errors import UserError
from backends.latency import LevelResult, RequestResult, percentile, to_ms
from backends.spec_metrics import FLAVORS, accept_len, scrape

CHAT_ENDPOINT = "/v1/chat/completions"
# Text-bearing fields of a streamed choice. Reasoning models (Kimi behind a reasoning parser)
# stream their thinking in `reasoning_content` (SGLang, older vLLM) or `reasoning` (newer vLLM).
_DELTA_TEXT_KEYS = ("content", "reasoning_content", "reasoning")
# Per-request extras some servers attach to chunks (SGLang `meta_info`, vLLM `metrics`).
_SERVER_META_KEYS = ("usage", "meta_info", "metrics")


@dataclass(slots=True)
class LoadSpec:
    """What to send and how hard. Prompts are token ids (sent as ``prompt: [ids]``) or text;
    the chat endpoint takes text only. Prompts are used in order and cycled, continuing across
    warm-ups and levels, so a short list is reused only once exhausted."""

    base_url: str
    model: str
    prompts: list[list[int]] | list[str]
    output_len: int
    concurrency_levels: tuple[int, ...]
    requests_per_level: int | None = None  # default: max(2 * concurrency, 8)
    warmup_requests: int = 2
    temperature: float = 0.0
    endpoint: str = "/v1/completions"
    timeout_s: float = 600.0  # per request, end to end
    metrics_flavor: str = "none"  # "sglang" | "vllm" | "dflash" | "none"
    # SGLang, vLLM and ours accept it; it makes every request produce exactly output_len tokens.
    ignore_eos: bool = True
    output_lens: list[int] | None = None  # per prompt, in order; None: output_len for every one
    request_rate: float | None = None  # requests/s of an open loop; None: closed loop
    seed: int = 0  # of the open loop's arrival times

    def __post_init__(self) -> None:
        if not self.prompts:
            raise UserError("prompts must not be empty")
        if self.output_len < 1 or not self.concurrency_levels or min(self.concurrency_levels) < 1:
            raise UserError("output_len and every concurrency level must be >= 1")
        if self.endpoint == CHAT_ENDPOINT and not all(isinstance(p, str) for p in self.prompts):
            raise UserError(f"{CHAT_ENDPOINT} takes text prompts, not token ids")
        if self.metrics_flavor not in FLAVORS:
            raise UserError(f"metrics_flavor must be one of {', '.join(FLAVORS)}")
        if self.output_lens is not None and (len(self.output_lens) != len(self.prompts)
                                             or min(self.output_lens) < 1):
            raise UserError("output_lens must give a length >= 1 for each prompt")
        if self.request_rate is not None and not self.request_rate > 0:
            raise UserError("request_rate must be > 0 requests/s")

    def requests(self) -> Iterator[tuple[list[int] | str, int]]:
        """(prompt, max_tokens) pairs, cycled forever."""
        lens = self.output_lens or [self.output_len] * len(self.prompts)
        return itertools.cycle(list(zip(self.prompts, lens)))

    def level_requests(self, concurrency: int) -> int:
        # Two waves at least, so that every slot sees a request start mid-run.
        return self.requests_per_level or max(2 * concurrency, 8)


# --- running -------------------------------------------------------------------------------------


def run_load(spec: LoadSpec, gpus: int = 1) -> list[Measurement]:
    """Measure every concurrency level of ``spec``; one :class:`Measurement` per level."""
    return [level.measurement(gpus) for level in asyncio.run(run_levels(spec))]


async def run_levels(spec: LoadSpec) -> list[LevelResult]:
    """Run the levels in order; never raises for a failing server."""
    prompts = spec.requests()
    async with contextlib.AsyncExitStack() as stack:
        users = [await stack.enter_async_context(client) for client in _clients(spec)]
        return [await _run_level(users, spec, prompts, c) for c in spec.concurrency_levels]


def _clients(spec: LoadSpec) -> list[httpx.AsyncClient]:
    """One single-connection client per simulated user. A shared pool would cost O(pool size)
    per request in httpcore's connection assignment, which at 256 users is enough CPU to skew
    the very latencies being measured; it also keeps each user on its own keep-alive
    connection, as a real client would be."""
    tls = ssl.create_default_context()  # built once: creating one per client costs ~25 ms each
    # trust_env=False: a proxy from the environment must not sit between us and the server.
    return [httpx.AsyncClient(base_url=spec.base_url, timeout=httpx.Timeout(spec.timeout_s),
                              limits=httpx.Limits(max_connections=1), verify=tls,
                              trust_env=False)
            for _ in range(max(spec.concurrency_levels))]


async def _run_level(users: list[httpx.AsyncClient], spec: LoadSpec, prompts: Iterator,
                     concurrency: int) -> LevelResult:
    scraper = users[0]  # idle whenever a scrape happens: before and after the closed loop
    # Warm-up first so that connection setup and first-request work stay out of the numbers,
    # and its rounds land before the `before` scrape, out of the acceptance delta.
    await _closed_loop(users, spec, prompts, concurrency, spec.warmup_requests)
    await _connect(users[:concurrency])
    before = await scrape(scraper, spec.metrics_flavor)
    lags: list[float] = []
    probe = asyncio.create_task(_probe_lag(lags))
    start = time.perf_counter()
    n = spec.level_requests(concurrency)
    if spec.request_rate is None:
        requests = await _closed_loop(users, spec, prompts, concurrency, n)
    else:
        gaps = arrival_gaps(spec.request_rate, n, f"{spec.seed}:{concurrency}")
        requests = await _open_loop(users[:concurrency], spec, prompts, gaps)
    wall_s = time.perf_counter() - start
    probe.cancel()
    after = await scrape(scraper, spec.metrics_flavor)
    tau = accept_len(spec.metrics_flavor, before, after)
    return LevelResult(concurrency, requests, wall_s, tau, to_ms(percentile(lags, 99)))


async def _probe_lag(lags: list[float], period_s: float = 0.005) -> None:
    while True:
        due = time.perf_counter() + period_s
        await asyncio.sleep(period_s)
        lags.append(time.perf_counter() - due)


async def _connect(users: list[httpx.AsyncClient]) -> None:
    """Open every user's connection before the clock starts: setting up hundreds of them at
    once costs the client milliseconds of CPU each, which would land in the first wave's TTFT.
    ``/v1/models`` is cheap on every server; a failure here shows up in the requests anyway."""
    await asyncio.gather(*(user.get("/v1/models") for user in users), return_exceptions=True)


async def _closed_loop(users: list[httpx.AsyncClient], spec: LoadSpec, prompts: Iterator,
                       concurrency: int, n: int) -> list[RequestResult]:
    """``n`` requests, ``concurrency`` workers: exactly min(concurrency, remaining) in flight."""
    results: list[RequestResult] = []
    slots = iter(range(n))

    async def worker(client: httpx.AsyncClient) -> None:
        for _ in slots:  # shared iterator: each slot is taken by exactly one worker
            results.append(await _send(client, spec, next(prompts)))

    await asyncio.gather(*(worker(users[i]) for i in range(min(concurrency, n))))
    return results


def arrival_gaps(rate: float, n: int, seed: str) -> list[float]:
    """Seconds before each of ``n`` arrivals of a Poisson process of ``rate`` per second (the
    first at once); the same seed gives the same schedule on every run."""
    rng = random.Random(seed)
    return [0.0] + [rng.expovariate(rate) for _ in range(n - 1)]


async def _open_loop(users: list[httpx.AsyncClient], spec: LoadSpec, prompts: Iterator,
                     gaps: list[float]) -> list[RequestResult]:
    """One request per gap, each sent by the first free user (so at most ``len(users)`` in
    flight); the arrivals keep their schedule whatever the server does."""
    results: list[RequestResult] = []
    free: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
    for user in users:
        free.put_nowait(user)

    async def arrive(request: tuple[list[int] | str, int]) -> None:
        client = await free.get()
        try:
            results.append(await _send(client, spec, request))
        finally:
            free.put_nowait(client)

    sent = []
    for gap in gaps:
        await asyncio.sleep(gap)
        sent.append(asyncio.create_task(arrive(next(prompts))))
    await asyncio.gather(*sent)
    return results


async def _send(client: httpx.AsyncClient, spec: LoadSpec,
                request: tuple[list[int] | str, int]) -> RequestResult:
    result = RequestResult(start_s=time.perf_counter())
    try:
        await _within(spec.timeout_s, _stream(client, spec, request, result))
    except asyncio.TimeoutError:
        result.error = f"timed out after {spec.timeout_s:g} s"
    # Any error, not just httpx's: a misbehaving server must cost one request, not the sweep.
    except Exception as exc:  # noqa: BLE001
        result.error = f"{type(exc).__name__}: {exc}"[:500]
    if result.end_s is None:
        result.end_s = time.perf_counter()
    if result.ok and result.output_tokens == 0:
        result.error = "stream ended without any token"
    return result


async def _within(seconds: float, work: Coroutine[Any, Any, None]) -> None:
    if sys.version_info < (3, 11):
        return await asyncio.wait_for(work, seconds)
    # In this task: wait_for's extra task would let other requests end between this one's end
    # and the next start, so the loop would briefly hold fewer than `concurrency` in flight.
    async with asyncio.timeout(seconds):
        await work


async def _stream(client: httpx.AsyncClient, spec: LoadSpec,
                  request: tuple[list[int] | str, int], result: RequestResult) -> None:
    async with client.stream("POST", spec.endpoint, json=_payload(spec, *request)) as response:
        if response.status_code != 200:
            body = (await response.aread()).decode(errors="replace")
            result.error = f"HTTP {response.status_code}: {body[:300]}"
            return
        done = False
        async for data, now in _data_lines(response):
            done = done or data == b"[DONE]"
            if data and not done:
                _on_chunk(result, json.loads(data), now)
        # E2E ends with the body, which servers close right after [DONE]. Stamping it here,
        # with no await before the user's next request starts, keeps the closed loop exact.
        result.end_s = time.perf_counter()
    usage = result.server_meta.get("usage") or {}
    result.output_tokens = int(usage.get("completion_tokens") or len(result.token_times))


def _payload(spec: LoadSpec, prompt: list[int] | str, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": spec.model, "max_tokens": max_tokens, "temperature": spec.temperature,
        "stream": True, "stream_options": {"include_usage": True},
    }
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if spec.endpoint == CHAT_ENDPOINT:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


class StreamError(RuntimeError):
    """The server reported an error inside a stream that had started with HTTP 200."""


async def _data_lines(response: httpx.Response) -> AsyncIterator[tuple[bytes, float]]:
    """The ``data:`` payloads of a server-sent event stream, each with its arrival time. Reads
    the body to its very end: one left unread makes httpx close the connection, and the user's
    next request would pay for a new one."""
    pending = b""
    async for piece in response.aiter_bytes():  # bytes: skips aiter_lines' text decoding
        now = time.perf_counter()  # on arrival, so parsing is not in the timings
        *lines, pending = (pending + piece).split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip(), now
    if pending.startswith(b"data:"):
        yield pending[5:].strip(), time.perf_counter()


def _on_chunk(result: RequestResult, chunk: dict[str, Any], now: float) -> None:
    if chunk.get("error"):
        raise StreamError(str(chunk["error"])[:300])
    result.server_meta.update({k: chunk[k] for k in _SERVER_META_KEYS if chunk.get(k)})
    if any(_has_text(choice) for choice in chunk.get("choices") or ()):
        if result.first_token_s is None:
            result.first_token_s = now
        result.token_times.append(now)


def _has_text(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta") or {}
    return bool(choice.get("text")) or any(delta.get(key) for key in _DELTA_TEXT_KEYS)
