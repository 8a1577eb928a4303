"""A request body as the front end takes it: bounded in size (413, from its Content-Length
when it declares one, before a byte of it is read) and in time (408 for a body that trickles),
so one client cannot hold the event loop or the memory that every other client shares."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.requests import Request

from backends.dflash_server.options import BODY_TIMEOUT_S, MAX_BODY_BYTES
from backends.dflash_server.protocol import BadRequest


@dataclass(slots=True, frozen=True)
class Intake:
    max_bytes: int = MAX_BODY_BYTES
    timeout_s: float = BODY_TIMEOUT_S

    async def body(self, request: Request) -> bytes:
        """The whole body, or a BadRequest with status 413 or 408 (starlette's ClientDisconnect
        if the client leaves meanwhile)."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise self._too_large()
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._read(request)
        except TimeoutError:
            raise BadRequest(f"the request body did not arrive within {self.timeout_s:g} s",
                             status=408) from None

    async def _read(self, request: Request) -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_bytes:
                raise self._too_large()
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self) -> BadRequest:
        return BadRequest(f"the request body is larger than this server takes, "
                          f"{self.max_bytes} bytes (serve --max-body-bytes)", status=413)
