"""Connections as the front end keeps them: uvicorn's h11 protocol with a deadline for each
request's headers, and a cap on open connections under which the oldest idle one (no request
in progress) is closed to make room for a new one, so idle and half-open connections can neither
exhaust the file descriptors nor lock out a client that wants an answer. Each such condition is
logged as one line a minute, never one per connection (nor a traceback per failed accept)."""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import resource
import socket
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("dflash_tune.serve")

FD_RESERVE = 64  # descriptors kept for the process's own files, pipes and listening socket
# Connections asyncio accepts in one go (it takes the listen backlog given to create_server for
# this). A connection is counted (connection_made) two loop iterations after its accept, and one
# it closes frees its descriptor an iteration later: IN_FLIGHT_BATCHES are kept free for them.
ACCEPT_BATCH = 64
IN_FLIGHT_BATCHES = 4
# The kernel's queue of connections not yet accepted (uvicorn's default; the kernel caps it at
# net.core.somaxconn): set after the server starts, so that a burst of connections waits there
# rather than having its handshakes dropped (a dropped SYN costs its client a second).
LISTEN_BACKLOG = 2048
OUT_OF_FILES = (errno.EMFILE, errno.ENFILE)


class Throttled:
    """One log line per condition a minute, counting what happened in between."""

    def __init__(self, every_s: float = 60.0) -> None:
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def warn(self, condition: str) -> None:
        self._since[condition] = self._since.get(condition, 0) + 1
        now = time.monotonic()
        if now - self._last.get(condition, -math.inf) >= self.every_s:
            log.warning("%s (%d times; at most one such line a minute)", condition,
                        self._since.pop(condition))
            self._last[condition] = now


def connection_cap(wanted: int) -> int:
    """`wanted`, or less if the open-file limit leaves room for fewer connections."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    room = max(1, soft - FD_RESERVE - IN_FLIGHT_BATCHES * ACCEPT_BATCH)
    if room < wanted:
        log.warning("--max-connections %d lowered to %d: the open-file limit is %d", wanted,
                    room, soft)
    return min(wanted, room)


def guarded_protocol(max_connections: int, header_timeout: float,
                     throttled: Throttled) -> type[H11Protocol]:
    waiting: dict[H11Protocol, None] = {}  # connections with no request in progress, oldest first

    class GuardedProtocol(H11Protocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.deadline = None
            self._wait()
            if len(self.connections) > max_connections:
                self._make_room()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_waiting()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if not self.idle():  # the request's headers are in
                self._stop_waiting()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.idle() and not self.transport.is_closing():
                self._wait()

        def idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _wait(self) -> None:
            self._stop_waiting()
            waiting[self] = None
            self.deadline = self.loop.call_later(header_timeout, self._headers_late)

        def _stop_waiting(self) -> None:
            waiting.pop(self, None)
            if self.deadline is not None:
                self.deadline.cancel()

        def _headers_late(self) -> None:
            throttled.warn(f"closed connections that sent no complete request headers within "
                           f"{header_timeout:g} s")
            self._close()

        def _close(self) -> None:
            self._stop_waiting()
            self.transport.close()

        def _make_room(self) -> None:
            oldest = next(iter(waiting))
            if oldest is not self:
                throttled.warn(f"{max_connections} connections open: closing the oldest idle "
                               "one for each new one")
            else:
                throttled.warn(f"{max_connections} connections open, all busy: refusing new ones")
            oldest._close()

    return GuardedProtocol


def deepen_backlog(listening: list) -> None:
    """Give the listening sockets (asyncio's TransportSockets) the LISTEN_BACKLOG queue."""
    for wrapped in listening:
        sock = socket.socket(fileno=wrapped.fileno())  # the same descriptor, not a copy
        try:
            sock.listen(LISTEN_BACKLOG)
        finally:
            sock.detach()  # the server keeps it open


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, throttled: Throttled) -> None:
    """Out of file descriptors, asyncio logs a traceback per failed accept; one line a minute
    says the same."""
    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        error = context.get("exception")
        if isinstance(error, OSError) and error.errno in OUT_OF_FILES:
            throttled.warn(f"out of file descriptors ({error.strerror}): new connections wait")
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
