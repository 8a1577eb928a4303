"""SLA limits written as ``metric<=value`` / ``metric>=value`` (``tpot_p50_ms<=30``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
            raise ValueError(f"SLA {text!r} is not of the form metric<=value or metric>=value")
        metric, op, value = match.groups()
        if metric not in SLA_METRICS:
            raise ValueError(f"SLA metric {metric!r} is unknown; use one of {', '.join(SLA_METRICS)}")
        return cls(metric, op, float(value))

    def violation(self, observed: float | None) -> float:
        """Optuna's constraint convention: <= 0 when met, positive by how much it is missed."""
        if observed is None:
            return 1.0
        return observed - self.value if self.op == "<=" else self.value - observed

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def meets(row: Any, limits: Sequence[Limit]) -> bool:
    """Whether a measurement (a Measurement or a stored row dict) succeeded within every limit."""
    get = row.get if isinstance(row, Mapping) else (lambda name: getattr(row, name))
    return get("failure") is None and all(lim.violation(get(lim.metric)) <= 0 for lim in limits)
