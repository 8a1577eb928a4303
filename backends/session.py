"""One launch of a configuration, measured at runtime points chosen while it runs.

A launch is what costs minutes on a real node (loading a 1T-param model, capturing graphs), while
a concurrency level costs seconds. A :class:`Session` is one launch: the tuner asks it for levels
one at a time (an SLA search picks the next level from the last), for a short or a long window,
for greedy outputs (the losslessness probe) and for a soak. Sessions never raise for a failing
configuration: a dead or broken server comes back as failed measurements.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass

from backends.contract import FailureClass, Measurement, ProbeUnsupported


@dataclass(slots=True)
class Clock:
    """Seconds a session spent launching and measuring; simulated backends add virtual time."""

    launch_s: float = 0.0
    measure_s: float = 0.0


class Session(abc.ABC):
    """A launched configuration. ``clock`` says what it cost so far."""

    def __init__(self) -> None:
        self.clock = Clock()

    def measure(self, concurrency: int, requests: int | None = None) -> Measurement:
        """One closed-loop level: ``concurrency`` requests in flight, ``requests`` in all
        (None: the backend's default window). Failures come back as a failed Measurement."""
        began = time.perf_counter()
        try:
            return self._level(concurrency, requests)
        finally:
            self.clock.measure_s += time.perf_counter() - began

    @abc.abstractmethod
    def _level(self, concurrency: int, requests: int | None) -> Measurement:
        """``measure`` without the bookkeeping."""

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[str]:
        """Greedy completions of ``prompts`` (the losslessness probe compares them across
        configurations); ProbeUnsupported where the backend cannot run a model."""
        raise ProbeUnsupported(f"{type(self).__name__} does not generate tokens")

    def alive(self) -> FailureClass | None:
        """None while the launched server is healthy; else how it died."""
        return None
