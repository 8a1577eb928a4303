"""The engine process's end of the pipe to the front end (client.py holds the other).

`dflash-tune serve` runs two processes, as vLLM and SGLang do: the engine process (the one the
tuner starts; rank 0 with --tp) owns the Engine and runs the rounds; the front-end process
(front.py) parses, tokenises, detokenises and streams. Neither waits on the other's GIL. Messages
are tuples of ids, tokens and short strings, never tensors:

    front -> engine   ("submit", id, prompt, SamplingParams, top_logprobs)
                      ("cancel", id)
    engine -> front   ("round", counters, [(id, Event), ...], error)   once per round with news

Each request is a `RemoteTicket` in the engine loop, so the loop's failure handling (one request
never takes the engine down) is the same in both modes; a round's events go in one message,
after the loop's gauges are settled, with the loop's error once it has stopped for good.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import astuple, dataclass, field
from multiprocessing.connection import Connection

from backends.dflash_server.loop import EngineLoop, Event, Ticket

log = logging.getLogger("dflash_tune.serve")


@dataclass(slots=True, eq=False)  # a Ticket is itself, not its fields
class RemoteTicket(Ticket):
    """A front-end request as the engine loop sees it: events go to the bridge's outbox."""

    id: int = 0
    outbox: list = field(default_factory=list)

    def push(self, event: Event) -> None:
        self.outbox.append((self.id, event))


class EngineBridge:
    """Feeds the front end's requests and cancellations to `loop` (a reader thread that waits
    on the pipe) and sends each round's events back (the loop's after_round hook)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.outbox: list[tuple[int, Event]] = []  # RemoteTickets append, after_round takes
        self._tickets: dict[int, RemoteTicket] = {}  # id -> live ticket
        self._sent: tuple = ((), None)  # the counters and error the front end last heard
        self._flush_lock = threading.Lock()  # the engine thread, or the reader once it stopped
        self._reader = threading.Thread(target=self._read, name="engine-bridge", daemon=True)
        self.loop: EngineLoop | None = None

    def start(self, loop: EngineLoop) -> None:
        self.loop = loop
        self._reader.start()

    def after_round(self, loop: EngineLoop) -> None:
        """Send what the round gave, if anything changed (runs on the engine thread)."""
        with self._flush_lock:
            events = self.outbox[:]
            del self.outbox[:len(events)]  # what was appended meanwhile waits for the next
            state = (astuple(loop.counters), loop.error)
            if not events and state == self._sent:
                return
            for ticket_id, event in events:
                if event.finish:
                    self._tickets.pop(ticket_id, None)
            counters, error = state
            self._send(("round", counters, events, error))
            self._sent = state

    def _read(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):  # the front end is gone: nothing left to serve
                return
            if message[0] == "submit":
                self._submit(*message[1:])
            elif message[0] == "cancel":
                ticket = self._tickets.pop(message[1], None)  # None: it has finished
                if ticket is not None:
                    ticket.cancel()

    def _submit(self, ticket_id: int, prompt: list[int], sampling, top_logprobs) -> None:
        ticket = RemoteTicket(prompt, sampling, None, top_logprobs, id=ticket_id,
                              outbox=self.outbox)
        self._tickets[ticket_id] = ticket
        try:
            self.loop.submit(ticket)
        except RuntimeError as error:  # the loop has stopped: answer now, no round will
            ticket.fail(str(error))
            self.after_round(self.loop)

    def _send(self, message: tuple) -> None:
        try:
            self.conn.send(message)
        except (OSError, ValueError):  # the front end closed its end; it is leaving
            log.debug("front end gone; dropping a round's events")
