"""What a backend promises, as plain values: the load a configuration is measured under
(:class:`Workload`), what one level measured (:class:`Measurement`), how a configuration failed
(:class:`FailureClass`), and the two ways a launch can refuse work.

A leaf: it imports nothing of ours, so every layer (loadgen, the performance model, records,
the tuner) can speak it without pulling in a backend.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from backends.errors import UserError

# The most concurrent requests a level (or a captured graph batch) may name: far above what one
# node's KV pool holds at any useful length, so a larger number is a typo, refused before any
# work whose cost grows with it (graph ladders, flag lists, load-test clients).
MAX_CONCURRENCY = 65_536


class FailureClass(str, enum.Enum):
    OOM = "oom"
    CRASH = "crash"
    TIMEOUT = "timeout"
    INVALID_CONFIG = "invalid_config"
    UNSUPPORTED = "unsupported"
    PORT_IN_USE = "port_in_use"
    TRANSIENT = "transient"

    @property
    def is_deterministic(self) -> bool:
        """Whether retrying the same configuration would fail the same way."""
        return self not in (FailureClass.TRANSIENT, FailureClass.PORT_IN_USE)


@dataclass(slots=True, frozen=True)
class Workload:
    """What load a configuration is measured under. Concurrency levels are swept in one launch."""

    input_len: int
    output_len: int
    concurrency: tuple[int, ...]
    temperature: float = 0.0
    # Prompts from this file (backends.datasets formats) instead of the target's held-out
    # prompts or random ids; input_len then only informs the performance model.
    dataset: str | None = None
    dataset_output_lens: bool = False  # each request asks for its sample's length, not output_len
    # Open loop: requests arrive as a Poisson process of this rate (per s), each level's
    # concurrency capping how many are in flight. None: closed loop, exactly that many in flight.
    request_rate: float | None = None

    def __post_init__(self) -> None:
        if self.input_len < 1 or self.output_len < 1:
            raise UserError("input_len and output_len must be >= 1")
        if not self.concurrency or min(self.concurrency) < 1:
            raise UserError("concurrency levels must be a non-empty list of integers >= 1")
        if max(self.concurrency) > MAX_CONCURRENCY:
            raise UserError(f"concurrency level {max(self.concurrency)} is above the "
                            f"{MAX_CONCURRENCY} concurrent requests a node can hold")
        if self.request_rate is not None and not self.request_rate > 0:
            raise UserError(f"request_rate must be > 0 requests/s, got {self.request_rate}")


@dataclass(slots=True)
class Measurement:
    """One configuration at one concurrency level. Units are in the field names."""

    concurrency: int
    output_tok_s: float = 0.0
    output_tok_s_per_gpu: float = 0.0
    tok_s_per_user: float = 0.0
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    accept_len_mean: float | None = None
    accept_len_hist: list[float] | None = None
    peak_mem_gib: float | None = None
    # Where the step time goes (ms per decode step), when the backend can tell; for a model,
    # where each component's time comes from (measured | roofline | fitted) and its share of
    # the hardware's speed of light (%).
    breakdown_ms: dict[str, float] = field(default_factory=dict)
    breakdown_source: dict[str, str] = field(default_factory=dict)
    breakdown_sol_pct: dict[str, float] = field(default_factory=dict)
    predicted: bool = False
    failure: FailureClass | None = None
    log_excerpt: str = ""

    @property
    def ok(self) -> bool:
        return self.failure is None

    def to_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["failure"] = self.failure.value if self.failure else None
        return row

    @classmethod
    def failed(cls, concurrency: int, failure: FailureClass, log_excerpt: str,
               predicted: bool = False) -> Measurement:
        return cls(concurrency=concurrency, failure=failure, log_excerpt=log_excerpt[-4000:],
                   predicted=predicted)


class LaunchFailed(Exception):
    """The configuration did not come up (or cannot be expressed): nothing can be measured."""

    def __init__(self, failure: FailureClass, log_excerpt: str) -> None:
        super().__init__(f"{failure.value}: {log_excerpt[-300:]}")
        self.failure, self.log_excerpt = failure, log_excerpt


class ProbeUnsupported(Exception):
    """This backend cannot produce tokens (the performance model predicts, it does not run)."""
