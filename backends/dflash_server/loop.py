"""The engine thread: admits waiting requests into free rows, runs rounds, streams tokens back.

Handlers on the asyncio side submit a `Ticket` and read its asyncio queue; the engine thread
pushes `Event`s onto it with `call_soon_threadsafe`. A ticket whose client went away is
cancelled and its row freed at the next round. `dflash-tune serve` runs this loop in the engine
process, its tickets standing for the front end's (bridge.py); in-process (`build`, the tests)
the handlers share its process.

One request must never take the engine down with it. An admission that raises is retried one
ticket at a time, so only the request that cannot be admitted fails; an error while delivering
to one ticket fails that ticket; a round that raises fails the requests it was serving (a round
is one computation over all of them) and the loop goes on. Only an error outside all of these,
or MAX_FAILED_ROUNDS rounds failing in a row (a broken device, not a request), stops it: then
every waiting client gets its error and /health reports it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from backends.dflash_server.logprobs import Scorer, TokenLogprobs
from dflash_core import Engine, SamplingParams, Spec

log = logging.getLogger("dflash_tune.serve")

MAX_FAILED_ROUNDS = 3
DEAD = f"engine failed: {MAX_FAILED_ROUNDS} rounds in a row raised"


@dataclass(slots=True)
class Event:
    """What one admission or round gave a request: its new tokens and, at the end, the finish
    ("stop", "max_tokens", "length", or "error" with `error` saying why)."""

    tokens: list[int]
    finish: str | None = None
    logprobs: list[TokenLogprobs] | None = None  # one per token, when the request asked
    error: str | None = None


@dataclass(slots=True, weakref_slot=True, eq=False)  # the Drain holds them in a WeakSet
class Ticket:
    prompt: list[int]
    sampling: SamplingParams
    loop: asyncio.AbstractEventLoop
    top_logprobs: int | None = None  # None: no logprobs; else how many alternatives per token
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    arrived_s: float = field(default_factory=time.perf_counter)
    scorer: Scorer | None = None
    on_cancel: Callable[[], None] | None = None  # tells an engine in another process

    def cancel(self) -> None:
        """The client went away (or its reply ended): its row is freed at the next round."""
        self.cancelled = True
        if self.on_cancel is not None:
            self.on_cancel()

    def push(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop has closed (shutdown): nobody is listening
            pass

    def fail(self, message: str) -> None:
        self.push(Event([], "error", error=message))


@dataclass(slots=True)
class Counters:
    """Cumulative, read by /metrics (ints: reading them needs no lock)."""

    requests: int = 0
    generated_tokens: int = 0
    spec_rounds: int = 0  # request-rounds
    spec_emitted_tokens: int = 0  # tokens those rounds produced (tau summed), before stops
    failed_requests: int = 0  # ended by an engine error (not refused at the HTTP boundary)
    running: int = 0
    waiting: int = 0


class EngineLoop:
    def __init__(self, engine: Engine, spec: Spec, seed: int = 0,
                 after_round: Callable[[EngineLoop], None] | None = None) -> None:
        """`after_round` runs on the engine thread after each admission-and-round and once when
        the loop stops (the engine process's bridge sends what the round gave from there)."""
        self.engine, self.spec = engine, spec
        self.batch = engine.open_batch(spec, seed=seed)
        self._scratch_keys = itertools.count()  # one scratch sequence per scored request
        self.inbox: queue.Queue[Ticket] = queue.Queue()
        self.tickets: dict[int, Ticket] = {}  # row -> ticket
        self.counters = Counters()
        self.error: str | None = None  # set once the loop has stopped for good
        self._failed_rounds = 0
        self._after_round = after_round or (lambda _: None)
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

    def check_prompts(self, prompts: list[list[int]]) -> list[list[int]]:
        """Engine.check_prompts: refuse a request on its handler, not on the engine thread."""
        return self.engine.check_prompts(prompts)

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while not self._stop.is_set() and self._failed_rounds < MAX_FAILED_ROUNDS:
                    self._admit(block=not self.tickets)
                    self._round()
                    self._after_round(self)
            if self._failed_rounds >= MAX_FAILED_ROUNDS:
                self._die(DEAD)
        except Exception as error:  # our own bookkeeping broke: report it, hang no client
            log.exception("engine loop failed")
            self._die(f"engine failed: {error!r}")
        finally:
            self._after_round(self)

    def _die(self, message: str) -> None:
        self.error = message
        for row in list(self.tickets):
            self._fail(row, message)
        while not self.inbox.empty():
            self.inbox.get_nowait().fail(message)
        self._gauges()

    # --- admission ----------------------------------------------------------------------------

    def _admit(self, block: bool) -> None:
        for row in list(self.tickets):
            if self.tickets[row].cancelled:
                self._finish(row)
        new = self._take(len(self.batch.free_rows()), block)
        if new:
            self._admit_all(new)
        self._gauges()

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

    def _admit_all(self, new: list[Ticket]) -> None:
        """One prefill for all of them; if it raises, each alone, so only a bad one fails."""
        try:
            events = self.batch.admit([t.prompt for t in new], [t.sampling for t in new])
        except Exception as error:  # noqa: BLE001  (any error: this request, not the loop)
            self._clear_free_rows()
            if len(new) == 1:
                self._refuse(new[0], error)
                return
            for ticket in new:
                self._admit_all([ticket])
            return
        for ticket, event in zip(new, events):
            self.tickets[event.row] = ticket
            self._deliver(event.row, event.tokens, event.finish)

    def _clear_free_rows(self) -> None:
        """A refused admission may have written some rows' sampling before it raised."""
        for row in self.batch.free_rows():
            self.batch.release(row)

    def _refuse(self, ticket: Ticket, error: Exception) -> None:
        log.warning("request refused by the engine: %r", error)
        self.counters.failed_requests += 1
        self._gauges()
        ticket.fail(f"the engine could not admit this request: {error}")

    # --- rounds -------------------------------------------------------------------------------

    def _round(self) -> None:
        if not self.tickets:
            return
        before = self.batch.stats.acceptance.copy()
        try:
            emitted = self.batch.step()
        except Exception as error:  # noqa: BLE001  (a round: fail its requests)
            self._round_failed(error)
            return
        self._failed_rounds = 0
        for event in emitted:
            self._deliver(event.row, event.tokens, event.finish)
        delta = self.batch.stats.acceptance - before
        self.counters.spec_rounds += sum(delta.values())
        self.counters.spec_emitted_tokens += sum(k * n for k, n in delta.items())
        self._gauges()

    def _round_failed(self, error: Exception) -> None:
        log.error("engine round failed; failing the %d requests it served", len(self.tickets),
                  exc_info=error)
        self._failed_rounds += 1
        if self._failed_rounds >= MAX_FAILED_ROUNDS:
            # Before its clients hear: whoever learns of the last failure sees a dead engine.
            self.error = DEAD
        for row in list(self.tickets):
            self._fail(row, f"engine round failed: {error!r}")
        self._gauges()

    def _deliver(self, row: int, tokens: list[int], finish: str | None) -> None:
        ticket = self.tickets[row]
        try:
            logprobs = self._logprobs(ticket, tokens, finish)
        except Exception as error:  # noqa: BLE001  scoring one request must not stop the others
            log.warning("logprobs failed for a request: %r", error)
            self._fail(row, f"logprobs failed: {error!r}")
            return
        self.counters.generated_tokens += len(tokens)
        if finish:
            self._finish(row)  # first, so a client that has its answer sees the gauges settled
        ticket.push(Event(tokens, finish, logprobs))

    def _logprobs(self, ticket: Ticket, tokens: list[int],
                  finish: str | None) -> list[TokenLogprobs] | None:
        if ticket.top_logprobs is None or ticket.cancelled:
            return None
        if ticket.scorer is None:
            ticket.scorer = Scorer(self.batch, next(self._scratch_keys), ticket.prompt,
                                   ticket.sampling.temperature, ticket.top_logprobs)
        return ticket.scorer.score(tokens, final=finish is not None)

    def _fail(self, row: int, message: str) -> None:
        self.counters.failed_requests += 1
        ticket = self._finish(row)
        ticket.fail(message)

    def _finish(self, row: int) -> Ticket:
        ticket = self.tickets.pop(row)
        if ticket.scorer is not None:
            ticket.scorer.close()  # its scratch cache goes with it
            ticket.scorer = None
        self.batch.release(row)
        self._gauges()
        return ticket

    def _gauges(self) -> None:
        self.counters.waiting = self.inbox.qsize()
        self.counters.running = len(self.tickets)
