"""What the collectives of a rank moved: calls and bytes per kind.

Bytes are each collective's buffer as the performance model sizes it (all-reduce: the tensor;
all-gather: the gathered result; broadcast: the payload), not the ring's wire bytes, which the
model derives from them (`backends.perf_model.step.Node.collective_ms`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

KINDS = ("all_reduce", "all_gather", "broadcast")


@dataclass(slots=True)
class Traffic:
    calls: Counter = field(default_factory=Counter)  # kind -> collectives
    bytes: Counter = field(default_factory=Counter)  # kind -> bytes

    def add(self, kind: str, nbytes: int, calls: int = 1) -> None:
        self.calls[kind] += calls
        self.bytes[kind] += nbytes

    def copy(self) -> Traffic:
        return Traffic(Counter(self.calls), Counter(self.bytes))

    def since(self, mark: Traffic) -> Traffic:
        return Traffic(self.calls - mark.calls, self.bytes - mark.bytes)

    def merge(self, other: Traffic) -> None:
        self.calls.update(other.calls)
        self.bytes.update(other.bytes)

    def per_round(self, rounds: int) -> dict[str, tuple[float, float]]:
        """kind -> (collectives, bytes) per round."""
        rounds = max(rounds, 1)
        return {k: (self.calls[k] / rounds, self.bytes[k] / rounds) for k in KINDS
                if self.calls[k]}
