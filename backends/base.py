"""The backend contract: render launch flags for a configuration and measure it.

Every backend (the performance model, the in-process engine, real SGLang / vLLM servers)
implements :class:`Backend`. A backend never lets an exception escape ``measure``: a failed
configuration is a :class:`Measurement` with a :class:`FailureClass` and a log excerpt, so a
study can learn from it instead of dying.
"""

from __future__ import annotations

import abc
import contextlib
import enum
from collections.abc import Iterator
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any
from typing import ClassVar

if TYPE_CHECKING:
    from backends.session import Session


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

    def __post_init__(self) -> None:
        if self.input_len < 1 or self.output_len < 1:
            raise ValueError("input_len and output_len must be >= 1")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError("concurrency levels must be a non-empty list of integers >= 1")


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
    # Where the step time goes (ms per decode step), when the backend can tell.
    breakdown_ms: dict[str, float] = field(default_factory=dict)
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


class Backend(abc.ABC):
    """Runs one serving configuration and measures it.

    ``params`` is the flat dict of trial parameters (names follow the engine flags they control,
    see :mod:`backends.launch_params`). Implementations must be re-entrant: ``measure`` may be
    called many times on one instance, and must return one :class:`Measurement` per concurrency
    level of the workload, in order, never raising for a failing configuration.
    """

    name: ClassVar[str]
    #: True when numbers come from a model rather than a run.
    predicts: ClassVar[bool] = False

    @abc.abstractmethod
    def flags(self, params: dict[str, Any]) -> list[str]:
        """The launch command for ``params`` as an argv list (what ``best --emit-flags`` prints)."""

    def env(self, params: dict[str, Any]) -> dict[str, str]:
        """Environment variables the launch needs beside its flags (none by default)."""
        return {}

    @abc.abstractmethod
    def measure(self, params: dict[str, Any], workload: Workload) -> list[Measurement]:
        """Measure ``params`` at every concurrency level of ``workload``."""

    @contextlib.contextmanager
    def session(self, params: dict[str, Any], workload: Workload) -> Iterator[Session]:
        """One launch of ``params`` to measure level by level (see :mod:`backends.session`);
        raises LaunchFailed when it cannot come up. This fallback runs ``measure`` per level;
        backends with a launch worth keeping override it."""
        from backends.session import PerLevelSession

        yield PerLevelSession(self, params, workload)
