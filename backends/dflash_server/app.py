"""OpenAI-compatible routes over the engine loop (Starlette): completions and chat, streaming or
not, plus /health, /v1/models and Prometheus /metrics with the speculation counters.

A request is parsed and checked in full (protocol.parse) before it is admitted; once admitted,
its row is freed whenever its client goes away, streaming or not. Its body is bounded
(intake.py); decoding it, tokenising and detokenising run on worker threads, so a large request
never stalls the event loop that answers everyone else. Once the server is stopping (drain.py)
a new request is a 503."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Protocol

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from backends.dflash_server.drain import STOPPING, Drain
from backends.dflash_server.intake import Intake
from backends.dflash_server.loop import Counters, Ticket
from backends.dflash_server.metrics import render_metrics
from backends.dflash_server.protocol import BadRequest, Job, ServerInfo, UnknownModel, parse
from backends.dflash_server.reply import Reply, error_body

__all__ = ["ServerInfo", "build_app"]

CLIENT_CLOSED = 499  # nginx's status for a client that left; nobody reads it


class EngineDoor(Protocol):
    """What the routes need of the engine: the in-process EngineLoop, or the EngineClient of
    an engine in another process."""

    counters: Counters
    error: str | None

    def submit(self, ticket: Ticket) -> None: ...

    def check_prompts(self, prompts: list[list[int]]) -> list[list[int]]: ...


def build_app(loop: EngineDoor, info: ServerInfo, intake: Intake | None = None,
              drain: Drain | None = None) -> Starlette:
    intake = intake if intake is not None else Intake()
    drain = drain if drain is not None else Drain()

    async def health(_: Request) -> Response:
        if loop.error:
            return JSONResponse({"status": "error", "error": loop.error}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def models(_: Request) -> Response:
        card = {"id": info.model_name, "object": "model", "owned_by": "dflash-tune",
                "max_model_len": info.max_context, "launch": info.launch}
        return JSONResponse({"object": "list", "data": [card]})

    async def metrics(_: Request) -> Response:
        return PlainTextResponse(render_metrics(loop.counters),
                                 media_type="text/plain; version=0.0.4")

    door = Door(loop, info, intake, drain)

    async def completions(request: Request) -> Response:
        return await _generate(request, door, chat=False)

    async def chat(request: Request) -> Response:
        return await _generate(request, door, chat=True)

    return Starlette(routes=[
        Route("/health", health), Route("/v1/models", models), Route("/metrics", metrics),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ])


@dataclass(slots=True)
class Door:
    """What a generation handler needs: the engine, the model, the body's bounds, the drain."""

    loop: EngineDoor
    info: ServerInfo
    intake: Intake
    drain: Drain


async def _generate(request: Request, door: Door, chat: bool) -> Response:
    if door.drain.draining:
        return _error(STOPPING, 503, "ServiceUnavailableError")
    try:
        job = await _job(request, door, chat)
    except UnknownModel as error:
        return _error(str(error), 404, "NotFoundError", "model")
    except BadRequest as error:
        return _error(str(error), error.status, param=error.param)
    except ClientDisconnect:  # it left mid-body: nobody to answer, nothing to log
        return Response(status_code=CLIENT_CLOSED)
    if door.drain.draining:  # the server began to stop while the body arrived
        return _error(STOPPING, 503, "ServiceUnavailableError")
    ticket = Ticket(job.prompt, job.sampling, asyncio.get_running_loop(), job.top_logprobs)
    try:
        door.loop.submit(ticket)
    except RuntimeError as error:
        return _error(str(error), 503, "ServiceUnavailableError")
    door.drain.track(ticket)
    reply = Reply(door.info, chat, job)
    if job.stream:
        # Starlette's StreamingResponse listens for the disconnect and closes the stream.
        return StreamingResponse(_stream(ticket, reply, door.drain),
                                 media_type="text/event-stream")
    try:
        return await _unless_client_leaves(request, ticket, _collect(ticket, reply))
    finally:
        door.drain.done(ticket)


async def _job(request: Request, door: Door, chat: bool) -> Job:
    async with door.intake.body(request) as raw:
        return await asyncio.to_thread(_parsed, raw, door, chat)


def _parsed(raw: bytes, door: Door, chat: bool) -> Job:
    """The body -> its Job (on a worker thread: decoding and tokenising a long prompt takes
    time the event loop owes everyone else)."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as error:  # not JSON, not UTF-8, nested past recursion
        raise BadRequest(f"the request body is not valid JSON: {error}"[:200]) from None
    job = parse(body, door.info, chat)
    try:  # here, not on the engine thread, which serves everyone
        door.loop.check_prompts([job.prompt])
    except ValueError as error:
        raise BadRequest(str(error), "messages" if chat else "prompt") from None
    return job


async def _stream(ticket: Ticket, reply: Reply, drain: Drain) -> AsyncIterator[str]:
    try:
        while reply.finish is None:
            text, logprobs = await asyncio.to_thread(reply.add, await ticket.events.get())
            if reply.finish == "error":
                yield _sse(error_body(reply.error, *_failure(reply.error)))
                break
            if text or logprobs or reply.finish:
                yield _sse(reply.chunk(text, logprobs))
        else:
            if reply.job.include_usage:
                yield _sse(reply.usage_chunk())
        yield "data: [DONE]\n\n"
    finally:
        ticket.cancel()  # a client that left frees its row; a no-op once finished
        drain.done(ticket)


async def _collect(ticket: Ticket, reply: Reply) -> Response:
    while reply.finish is None:
        await asyncio.to_thread(reply.add, await ticket.events.get())
    if reply.finish == "error":
        return _error(reply.error, *_failure(reply.error))
    return JSONResponse(reply.whole())


async def _unless_client_leaves(request: Request, ticket: Ticket,
                                work: Awaitable[Response]) -> Response:
    """Run `work` unless the client disconnects first; either way the ticket's row is freed
    (a stop string also ends a reply before the engine does)."""
    answer = asyncio.ensure_future(work)
    left = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({answer, left}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ticket.cancel()
        for task in (answer, left):
            task.cancel()  # a no-op for the one that finished
    return answer.result() if answer in done else Response(status_code=CLIENT_CLOSED)


async def _disconnected(request: Request) -> None:
    # The body has been read, so the next message a server sends is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _failure(message: str) -> tuple[int, str]:
    """The status of a request the engine failed: 503 when the server is stopping."""
    return (503, "ServiceUnavailableError") if message == STOPPING else \
        (500, "InternalServerError")


def _error(message: str, status: int, kind: str = "invalid_request_error",
           param: str | None = None) -> JSONResponse:
    # A body refused unread (413, 408, 503) ends its connection: the rest is not worth reading.
    headers = {"connection": "close"} if status in (408, 413, 503) else None
    return JSONResponse(error_body(message, status, kind, param), status_code=status,
                        headers=headers)


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"
