"""Stopping without cutting anyone off: once the server is told to stop (SIGTERM, SIGINT) it
admits no new request (503), lets the requests in flight finish for a grace period, then fails
those left with an error their stream carries (an error event, then `[DONE]`)."""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass, field

from backends.dflash_server.loop import Ticket

log = logging.getLogger("dflash_tune.serve")

STOPPING = "the server is shutting down"


@dataclass(slots=True)
class Drain:
    grace_s: float = 5.0
    # Tickets whose replies are still being sent (weak: a reply that never started is no leak).
    tickets: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    draining: bool = False
    _deadline: float = 0.0
    _failed: bool = False

    def track(self, ticket: Ticket) -> None:
        self.tickets.add(ticket)

    def done(self, ticket: Ticket) -> None:
        self.tickets.discard(ticket)

    def settled(self) -> bool:
        """Called while the server wants to stop: whether it may now close its connections."""
        now = time.monotonic()
        if not self.draining:
            self.draining, self._deadline = True, now + self.grace_s
            log.info("stopping: admitting no new requests, %d in flight", len(self.tickets))
        if not self.tickets:
            return True
        if now >= self._deadline and not self._failed:
            self._failed = True
            for ticket in list(self.tickets):
                ticket.fail(STOPPING)
                ticket.cancel()
        return now >= self._deadline + 1.0  # a failed stream has had time to send its end
