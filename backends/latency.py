"""Measured request timings and what a concurrency level adds up to (percentiles, tok/s).

Shared by the load generator (timings taken on the client of a real server) and the in-process
backend (timings taken around the engine's rounds), so both report the same statistics.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from backends.contract import FailureClass, Measurement

PERCENTILES = (50, 90, 99)


@dataclass(slots=True)
class RequestResult:
    """One request as the client saw it; times are ``time.perf_counter`` seconds."""

    start_s: float
    first_token_s: float | None = None
    end_s: float | None = None
    output_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    error: str | None = None
    # What the server reported about this request itself (`usage`, `meta_info`, `metrics`).
    server_meta: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.start_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.start_s

    @property
    def tpot_s(self) -> float | None:
        """Decode time per output token after the first: (E2E - TTFT) / (n - 1)."""
        if self.output_tokens < 2 or self.ttft_s is None or self.e2e_s is None:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def itls_s(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.token_times)]


@dataclass(slots=True)
class LevelResult:
    """All requests of one concurrency level, the wall time they took, and run-local tau."""

    concurrency: int
    requests: list[RequestResult]
    wall_s: float
    accept_len: float | None = None
    # How late the client's event loop ran a 5 ms timer (p99). A client short of CPU delays
    # every timestamp it takes by about this much; tens of ms means the numbers are suspect.
    client_lag_p99_ms: float | None = None

    @property
    def succeeded(self) -> list[RequestResult]:
        return [r for r in self.requests if r.ok]

    @property
    def failed(self) -> int:
        return len(self.requests) - len(self.succeeded)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.succeeded)

    def latency_ms(self) -> dict[str, float | None]:
        """p50/p90/p99 of TTFT, TPOT, ITL (pooled) and E2E over successful requests, keyed
        like ``ttft_p90_ms``."""
        ok = self.succeeded
        series = {"ttft": [r.ttft_s for r in ok], "tpot": [r.tpot_s for r in ok],
                  "itl": [itl for r in ok for itl in r.itls_s], "e2e": [r.e2e_s for r in ok]}
        return {f"{name}_p{q}_ms": to_ms(percentile([v for v in values if v is not None], q))
                for name, values in series.items() for q in PERCENTILES}

    def measurement(self, gpus: int = 1) -> Measurement:
        """This level as a :class:`Measurement`. All requests failed: TRANSIENT with the errors.
        Some failed: measured over the rest, with the failures summarised in the log excerpt.

        ``tok_s_per_user`` is ``output_tok_s / concurrency`` (the identity the backend contract
        checks)."""
        if not self.succeeded:
            return Measurement.failed(self.concurrency, FailureClass.TRANSIENT,
                                      self.error_summary())
        output_tok_s = self.output_tokens / self.wall_s
        lat = self.latency_ms()
        return Measurement(
            concurrency=self.concurrency, output_tok_s=output_tok_s,
            output_tok_s_per_gpu=output_tok_s / gpus,
            tok_s_per_user=output_tok_s / self.concurrency,
            ttft_p50_ms=lat["ttft_p50_ms"], ttft_p99_ms=lat["ttft_p99_ms"],
            tpot_p50_ms=lat["tpot_p50_ms"], tpot_p99_ms=lat["tpot_p99_ms"],
            itl_p50_ms=lat["itl_p50_ms"], itl_p99_ms=lat["itl_p99_ms"],
            accept_len_mean=self.accept_len,
            log_excerpt=self.error_summary() if self.failed else "",
        )

    def error_summary(self) -> str:
        errors = Counter(r.error for r in self.requests if r.error)
        head = f"{self.failed} of {len(self.requests)} requests failed at {self.concurrency}-way"
        lines = [head] + [f"{n}x {error}" for error, n in errors.most_common(5)]
        return "\n".join(lines)


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def to_ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3
