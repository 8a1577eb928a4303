"""Request bodies (intake.py): all the bodies being read at once are bounded together, so many
large ones at a time are a 503 rather than the front end's memory, and what they held is given
back once each is parsed or refused."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from backends.dflash_server.intake import BODIES_AT_ONCE, Intake
from backends.dflash_server.protocol import BadRequest


def _request(chunks: list[bytes], gate: asyncio.Event) -> Request:
    """A request whose body comes in `chunks`, the last one once `gate` opens."""
    messages = [{"type": "http.request", "body": c, "more_body": True} for c in chunks]
    messages[-1]["more_body"] = False

    async def receive() -> dict:
        if len(messages) == 1:
            await gate.wait()
        return messages.pop(0)

    return Request({"type": "http", "method": "POST", "headers": []}, receive)


async def _read(intake: Intake, request: Request) -> int:
    async with intake.body(request) as raw:
        await asyncio.sleep(0)
        return len(raw)


async def _many_at_once() -> list:
    intake, gate = Intake(max_bytes=10), asyncio.Event()
    reads = [asyncio.ensure_future(_read(intake, _request([b"x" * 6, b"y" * 4], gate)))
             for _ in range(BODIES_AT_ONCE + 2)]
    await asyncio.sleep(0.01)  # every body half read, waiting for its last chunk
    gate.set()
    results = await asyncio.gather(*reads, return_exceptions=True)
    return [intake.held, *results]


def test_too_many_large_bodies_at_once_are_a_503_and_what_they_held_is_given_back():
    held, *results = asyncio.run(_many_at_once())
    refused = [r for r in results if isinstance(r, BadRequest)]
    assert refused and all(r.status == 503 for r in refused)
    assert results.count(10) == len(results) - len(refused) >= BODIES_AT_ONCE - 1
    assert held == 0


def test_a_body_past_the_limit_is_a_413_before_it_is_read():
    async def read() -> None:
        request = Request({"type": "http", "method": "POST",
                           "headers": [(b"content-length", b"11")]}, _never)
        async with Intake(max_bytes=10).body(request):
            pass

    with pytest.raises(BadRequest) as refused:
        asyncio.run(read())
    assert refused.value.status == 413


async def _never() -> dict:
    raise AssertionError("a refused body is not read")
