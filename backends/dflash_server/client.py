"""The front end's end of the pipe to the engine process (bridge.py holds the other, and says
what travels on it). `EngineClient` stands where the in-process EngineLoop stands for the app:
submit, check_prompts, counters, error."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection

from backends.dflash_server.loop import Counters, Ticket
from backends.dflash_server.protocol import ServerInfo
from dflash_core.speculation.spec import checked_prompts

log = logging.getLogger("dflash_tune.serve")

ENGINE_LOST = "engine process exited"


class EngineClient:
    def __init__(self, conn: Connection, info: ServerInfo,
                 on_lost: Callable[[], None] = lambda: None) -> None:
        """`on_lost` runs (on the reader thread) once the engine process has gone, after every
        waiting client has heard: the server then shuts down."""
        self.conn, self.info, self.on_lost = conn, info, on_lost
        self.counters = Counters()
        self.error: str | None = None
        self.lost = False  # the engine process went away (not: its loop stopped)
        self._tickets: dict[int, Ticket] = {}  # id -> ticket still waiting for its finish
        self._next_id = 0
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="engine-client", daemon=True)

    def start(self) -> None:
        self._reader.start()

    def submit(self, ticket: Ticket) -> None:
        if self.error:
            raise RuntimeError(self.error)
        self._next_id += 1  # the event loop's thread alone submits
        ticket_id = self._next_id
        self._tickets[ticket_id] = ticket
        ticket.on_cancel = lambda: self._cancel(ticket_id)
        self._send(("submit", ticket_id, ticket.prompt, ticket.sampling, ticket.top_logprobs))
        if self.lost and self._tickets.pop(ticket_id, None) is not None:  # lost meanwhile
            ticket.fail(self.error)

    def check_prompts(self, prompts: list[list[int]]) -> list[list[int]]:
        return checked_prompts(prompts, self.info.vocab_size, self.info.max_context)

    def _cancel(self, ticket_id: int) -> None:
        if self._tickets.pop(ticket_id, None) is not None:  # not once its reply has finished
            self._send(("cancel", ticket_id))

    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                self.conn.send(message)
        except (OSError, ValueError) as error:  # the reader tells everyone it has gone
            log.debug("engine pipe closed: %r", error)

    def _read(self) -> None:
        while True:
            try:
                _, counters, events, error = self.conn.recv()
            except (EOFError, OSError):
                self._lose()
                return
            self.counters = Counters(*counters)  # first: an answered client sees them settled
            if error:
                self.error = error
            for ticket_id, event in events:
                ticket = self._tickets.get(ticket_id)
                if ticket is None:  # cancelled: its client has gone
                    continue
                if event.finish:
                    self._tickets.pop(ticket_id, None)  # (a cancel may have popped it meanwhile)
                ticket.push(event)

    def _lose(self) -> None:
        self.lost, self.error = True, self.error or ENGINE_LOST
        log.error("%s; failing %d requests and shutting down", ENGINE_LOST, len(self._tickets))
        for ticket_id in list(self._tickets):
            ticket = self._tickets.pop(ticket_id, None)
            if ticket is not None:
                ticket.fail(self.error)
        self.counters.running = self.counters.waiting = 0
        self.on_lost()
