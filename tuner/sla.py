"""SLA limits written as ``metric<=value`` / ``metric>=value`` (``tpot_p50_ms<=30``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tuner.errors import UsageError

_PATTERN = re.compile(r"^\s*([a-z_0-9]+)\s*(<=|>=)\s*([0-9.eE+-]+)\s*$")

# Metrics a limit may name: fields of backends.base.Measurement with a number in them.
SLA_METRICS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms",
               "itl_p99_ms", "tok_s_per_user", "output_tok_s", "output_tok_s_per_gpu",
               "accept_len_mean", "peak_mem_gib")


@dataclass(slots=True, frozen=True)
class Limit:
    metric: str
    op: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Limit:
        match = _PATTERN.match(text)
        if not match:
            raise UsageError(f"SLA {text!r} is not of the form metric<=value or metric>=value")
        metric, op, value = match.groups()
        if metric not in SLA_METRICS:
            raise UsageError(f"SLA metric {metric!r} is unknown; use one of {', '.join(SLA_METRICS)}")
        return cls(metric, op, float(value))

    def violation(self, observed: float | None) -> float:
        """Optuna's constraint convention: <= 0 when met, positive by how much it is missed."""
        if observed is None:
            return 1.0
        return observed - self.value if self.op == "<=" else self.value - observed

    def constraint(self, observed: float | None) -> float:
        """The violation relative to the limit, squashed below 1 (1: not observed). A sampler
        ranking infeasible trials by their summed violations then puts every measured trial
        before every failed one, and a TTFT missed by seconds does not drown a TPOT missed by
        milliseconds."""
        if observed is None:
            return 1.0
        miss = self.violation(observed) / (abs(self.value) or 1.0)
        return miss / (1.0 + miss) if miss > 0 else miss

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def meets(row: Any, limits: Sequence[Limit]) -> bool:
    """Whether a measurement (a Measurement or a stored row dict) succeeded within every limit."""
    get = row.get if isinstance(row, Mapping) else (lambda name: getattr(row, name))
    return get("failure") is None and all(lim.violation(get(lim.metric)) <= 0 for lim in limits)


def with_bounds(limits: Sequence[Limit], bounds: Sequence[Limit]) -> list[Limit]:
    """``limits`` and each bound on a metric they do not name (a limit overrides a bound)."""
    named = {limit.metric for limit in limits}
    return [*limits, *(b for b in bounds if b.metric not in named)]


def queueing(max_running_requests: int, concurrency: int) -> bool:
    """More requests offered than the engine runs at once: the rest wait, only TTFT shows it."""
    return max_running_requests < concurrency


# A winner's TTFT that no limit bounds is suspicious past these: the first token arriving later
# than the whole decode takes (and past a second), or past half a minute, means requests queue.
EXTREME_TTFT_FLOOR_S = 1.0
EXTREME_TTFT_S = 30.0


def extreme(row: Mapping[str, Any], limits: Sequence[Limit], output_len: int) -> list[str]:
    """Why a measured row looks wrong on a TTFT the SLA leaves unbounded (p50 first, then
    p99); empty if fine."""
    named = {limit.metric for limit in limits}
    decode_ms = (row.get("tpot_p50_ms") or 0.0) * output_len
    for metric in ("ttft_p50_ms", "ttft_p99_ms"):
        ms = row.get(metric)
        if metric in named or ms is None:
            continue
        if ms > EXTREME_TTFT_S * 1e3 or ms > max(EXTREME_TTFT_FLOOR_S * 1e3, decode_ms):
            return [f"{metric} is {ms:,.0f} ms (decoding {output_len} tokens takes "
                    f"{decode_ms:,.0f} ms): requests queue for their first token"]
    return []
