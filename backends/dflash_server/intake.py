"""A request body as the front end takes it: bounded in size (413, from its Content-Length
when it declares one, before a byte of it is read), in time (408 for a body that trickles), and
all bodies together (503 while BODIES_AT_ONCE largest ones are being read and parsed), so that
neither one client nor many can hold the event loop or the memory every client shares."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request

from backends.dflash_server.options import BODY_TIMEOUT_S, MAX_BODY_BYTES
from backends.dflash_server.protocol import BadRequest

BODIES_AT_ONCE = 4  # of --max-body-bytes each: what the front end holds of bodies at most


@dataclass(slots=True)
class Intake:
    max_bytes: int = MAX_BODY_BYTES
    timeout_s: float = BODY_TIMEOUT_S
    held: int = 0  # bytes of the bodies being read or parsed now

    @contextlib.asynccontextmanager
    async def body(self, request: Request) -> AsyncIterator[bytes]:
        """The whole body, held (counted) while the caller parses it; or a BadRequest with
        status 413, 408 or 503 (starlette's ClientDisconnect if the client leaves)."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise self._too_large()
        chunks: list[bytes] = []
        try:
            await self._read_in_time(request, chunks)
            yield b"".join(chunks)
        finally:
            self.held -= sum(map(len, chunks))

    async def _read_in_time(self, request: Request, chunks: list[bytes]) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._read(request, chunks)
        except TimeoutError:
            raise BadRequest(f"the request body did not arrive within {self.timeout_s:g} s",
                             status=408) from None

    async def _read(self, request: Request, chunks: list[bytes]) -> None:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_bytes:
                raise self._too_large()
            if self.held + len(chunk) > BODIES_AT_ONCE * self.max_bytes:
                raise BadRequest("the server is reading too many large request bodies at once; "
                                 "retry later", status=503)
            self.held += len(chunk)
            chunks.append(chunk)

    def _too_large(self) -> BadRequest:
        return BadRequest(f"the request body is larger than this server takes, "
                          f"{self.max_bytes} bytes (serve --max-body-bytes)", status=413)
