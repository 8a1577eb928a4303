"""OpenAI-compatible routes over the engine loop (Starlette): completions and chat, streaming or
not, plus /health, /v1/models and Prometheus /metrics with the speculation counters."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from backends.dflash_server.loop import EngineLoop, Ticket
from backends.dflash_server.metrics import render_metrics
from dflash_core import SamplingParams

FINISH = {"stop": "stop", "max_tokens": "length", "length": "length", "error": "error"}


class BadRequest(ValueError):
    pass


@dataclass(slots=True)
class ServerInfo:
    model_name: str
    tokenizer: Any  # tokenizers.Tokenizer
    eos_token_id: int | None
    max_context: int
    launch: dict[str, Any]  # the launch options, echoed by /v1/models


def build_app(loop: EngineLoop, info: ServerInfo) -> Starlette:
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

    async def completions(request: Request) -> Response:
        return await _generate(request, loop, info, chat=False)

    async def chat(request: Request) -> Response:
        return await _generate(request, loop, info, chat=True)

    return Starlette(routes=[
        Route("/health", health), Route("/v1/models", models), Route("/metrics", metrics),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ])


async def _generate(request: Request, loop: EngineLoop, info: ServerInfo, chat: bool) -> Response:
    try:
        body = await request.json()
        prompt = _chat_prompt(body, info) if chat else _prompt(body, info)
        loop.engine.check_prompts([prompt])  # here, not on the engine thread, which serves all
        sampling = _sampling(body, info)
    except (BadRequest, ValueError, TypeError, json.JSONDecodeError) as error:
        return JSONResponse({"error": {"message": str(error), "type": "invalid_request_error"}},
                            status_code=400)
    ticket = Ticket(prompt, sampling, asyncio.get_running_loop())
    try:
        loop.submit(ticket)
    except RuntimeError as error:
        return JSONResponse({"error": {"message": str(error)}}, status_code=503)
    reply = _Reply(info, chat, len(prompt))
    if body.get("stream"):
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(_stream(ticket, reply, usage), media_type="text/event-stream")
    return await _collect(ticket, reply)


def _prompt(body: dict, info: ServerInfo) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return info.tokenizer.encode(prompt).ids
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return prompt
    raise BadRequest("prompt must be a string or a non-empty list of token ids (one prompt)")


def _chat_prompt(body: dict, info: ServerInfo) -> list[int]:
    """The tiny pair has no chat template: roles become plain-text headers."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    return info.tokenizer.encode(text + "<|assistant|>\n").ids


def _sampling(body: dict, info: ServerInfo) -> SamplingParams:
    max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    stops = tuple(int(t) for t in body.get("stop_token_ids") or ())
    if info.eos_token_id is not None and not body.get("ignore_eos"):
        stops += (info.eos_token_id,)
    return SamplingParams(temperature=float(body.get("temperature", 1.0)),
                          top_k=max(0, int(body.get("top_k") or 0)),
                          top_p=float(body.get("top_p", 1.0)), max_tokens=max_tokens,
                          stop_token_ids=stops)


class _Reply:
    """Builds OpenAI response objects and turns token ids into text deltas."""

    def __init__(self, info: ServerInfo, chat: bool, prompt_len: int) -> None:
        self.info, self.chat, self.prompt_len = info, chat, prompt_len
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.tokens: list[int] = []
        self.sent_text = ""

    def delta(self, tokens: list[int]) -> str:
        self.tokens += tokens
        text = self.info.tokenizer.decode(self.tokens)
        if text.endswith("\ufffd"):  # a multi-byte character split across tokens: wait
            return ""
        new, self.sent_text = text[len(self.sent_text):], text
        return new

    def chunk(self, text: str, finish: str | None) -> dict:
        choice = ({"index": 0, "delta": {"role": "assistant", "content": text}}
                  if self.chat else {"index": 0, "text": text})
        choice["finish_reason"] = FINISH.get(finish) if finish else None
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat
                else "text_completion", "created": self.created, "model": self.info.model_name,
                "choices": [choice]}

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_len, "completion_tokens": len(self.tokens),
                "total_tokens": self.prompt_len + len(self.tokens)}

    def whole(self, finish: str | None) -> dict:
        choice = ({"index": 0, "message": {"role": "assistant", "content": self.sent_text}}
                  if self.chat else {"index": 0, "text": self.sent_text})
        choice["finish_reason"] = FINISH.get(finish)
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.info.model_name, "choices": [choice],
                "usage": self.usage()}


async def _stream(ticket: Ticket, reply: _Reply, usage: bool) -> AsyncIterator[str]:
    try:
        finish = None
        while finish is None:
            tokens, finish = await ticket.events.get()
            text = reply.delta(tokens)
            if text or finish:
                yield _sse(reply.chunk(text, finish))
        if usage:
            yield _sse({**reply.chunk("", None), "choices": [], "usage": reply.usage()})
        yield "data: [DONE]\n\n"
    finally:
        ticket.cancelled = True  # a client that left frees its row; a no-op once finished


async def _collect(ticket: Ticket, reply: _Reply) -> Response:
    finish = None
    try:
        while finish is None:
            tokens, finish = await ticket.events.get()
            reply.delta(tokens)
    finally:
        ticket.cancelled = True
    if finish == "error":
        return JSONResponse({"error": {"message": "engine failed"}}, status_code=500)
    reply.sent_text = reply.info.tokenizer.decode(reply.tokens)
    return JSONResponse(reply.whole(finish))


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"
