"""The engine thread: admits waiting requests into free rows, runs rounds, streams tokens back.

Handlers on the asyncio side submit a `Ticket` and read its asyncio queue; the engine thread
pushes (tokens, finish) items onto it with `call_soon_threadsafe`. A ticket whose client went
away is cancelled and its row freed at the next round.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from dflash_core import Engine, SamplingParams, Spec

log = logging.getLogger("dflash_tune.serve")


@dataclass(slots=True)
class Ticket:
    prompt: list[int]
    sampling: SamplingParams
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    arrived_s: float = field(default_factory=time.perf_counter)

    def push(self, tokens: list[int], finish: str | None) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (tokens, finish))


@dataclass(slots=True)
class Counters:
    """Cumulative, read by /metrics (ints: reading them needs no lock)."""

    requests: int = 0
    generated_tokens: int = 0
    spec_rounds: int = 0  # request-rounds
    spec_emitted_tokens: int = 0  # tokens those rounds produced (tau summed), before stops
    running: int = 0
    waiting: int = 0


class EngineLoop:
    def __init__(self, engine: Engine, spec: Spec, seed: int = 0) -> None:
        self.engine, self.spec = engine, spec
        self.batch = engine.open_batch(spec, seed=seed)
        self.inbox: queue.Queue[Ticket] = queue.Queue()
        self.tickets: dict[int, Ticket] = {}  # row -> ticket
        self.counters = Counters()
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def submit(self, ticket: Ticket) -> None:
        if self.error:
            raise RuntimeError(self.error)
        self.counters.requests += 1
        self.inbox.put(ticket)

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while not self._stop.is_set():
                    self._admit(block=not self.tickets)
                    self._step()
        except Exception as error:  # the server must report it, not hang its clients
            log.exception("engine loop failed")
            self.error = f"engine failed: {error!r}"
            for ticket in self.tickets.values():
                ticket.push([], "error")

    def _admit(self, block: bool) -> None:
        for row in list(self.tickets):
            if self.tickets[row].cancelled:
                self._finish(row)
        new = self._take(len(self.batch.free_rows()), block)
        if new:
            events = self.batch.admit([t.prompt for t in new], [t.sampling for t in new])
            for ticket, event in zip(new, events):
                self.tickets[event.row] = ticket
                self._deliver(event.row, event.tokens, event.finish)
        self.counters.waiting = self.inbox.qsize()
        self.counters.running = len(self.tickets)

    def _take(self, room: int, block: bool) -> list[Ticket]:
        taken: list[Ticket] = []
        while len(taken) < room:
            try:
                ticket = self.inbox.get(timeout=0.05) if block and not taken else \
                    self.inbox.get_nowait()
            except queue.Empty:
                break
            if not ticket.cancelled:
                taken.append(ticket)
        return taken

    def _step(self) -> None:
        if not self.tickets:
            return
        before = self.batch.stats.acceptance.copy()
        for event in self.batch.step():
            self._deliver(event.row, event.tokens, event.finish)
        delta = self.batch.stats.acceptance - before
        self.counters.spec_rounds += sum(delta.values())
        self.counters.spec_emitted_tokens += sum(k * n for k, n in delta.items())
        self.counters.running = len(self.tickets)

    def _deliver(self, row: int, tokens: list[int], finish: str | None) -> None:
        self.counters.generated_tokens += len(tokens)
        self.tickets[row].push(tokens, finish)
        if finish:
            self._finish(row)

    def _finish(self, row: int) -> None:
        self.tickets.pop(row)
        self.batch.release(row)
