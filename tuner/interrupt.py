"""Ctrl-C that never lands inside Optuna's bookkeeping.

The first SIGINT interrupts a measurement in progress at once (Optuna marks that trial failed);
arriving anywhere else, it is held until the next trial starts, which then fails straight away.
Either way the storage is never left with a half-written trial and the study can be resumed.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class InterruptGate:
    def __init__(self) -> None:
        self.requested = False
        self._measuring = False

    def handle(self, signum: int, frame: object) -> None:
        self.requested = True
        if self._measuring:
            raise KeyboardInterrupt

    @contextmanager
    def measuring(self) -> Iterator[None]:
        """Wrap the interruptible part of a trial."""
        if self.requested:
            raise KeyboardInterrupt
        self._measuring = True
        try:
            yield
        finally:
            self._measuring = False


@contextmanager
def graceful_interrupt() -> Iterator[InterruptGate]:
    gate = InterruptGate()
    if threading.current_thread() is not threading.main_thread():
        yield gate  # signals only reach the main thread; nothing to install
        return
    previous = signal.signal(signal.SIGINT, gate.handle)
    try:
        yield gate
    finally:
        signal.signal(signal.SIGINT, previous)
    if gate.requested:
        raise KeyboardInterrupt
