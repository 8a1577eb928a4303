"""The backend contract: render launch flags for a configuration and launch it to measure.

Every backend (the performance model, the in-process engine, real SGLang / vLLM servers)
implements :class:`Backend`: ``flags`` and ``session``. ``measure`` is derived from ``session``
once, here, and never lets an exception escape: a failed configuration is a
:class:`Measurement` with a :class:`FailureClass` and a log excerpt, so a study can learn from it
instead of dying.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator
from typing import ClassVar

from backends.contract import FailureClass, LaunchFailed, Measurement, Workload
from backends.flags import UnsupportedParams
from backends.launch_params import InvalidParams, LaunchParams
from backends.session import Session


class Backend(abc.ABC):
    """Runs one serving configuration and measures it.

    Every method takes a :class:`LaunchParams` (parsed once, where a trial's parameters enter
    the tuner). Implementations must be re-entrant: ``session`` may be entered many times on one
    instance, one launch at a time.
    """

    name: ClassVar[str]
    #: True when numbers come from a model rather than a run.
    predicts: ClassVar[bool] = False

    @abc.abstractmethod
    def flags(self, launch: LaunchParams) -> list[str]:
        """The launch command as an argv list (what ``best --emit-flags`` prints); raises
        UnsupportedParams when this engine cannot express ``launch``."""

    def env(self, launch: LaunchParams) -> dict[str, str]:
        """Environment variables the launch needs beside its flags (none by default)."""
        return {}

    @abc.abstractmethod
    def session(self, launch: LaunchParams, workload: Workload
                ) -> contextlib.AbstractContextManager[Session]:
        """One launch of ``launch`` to measure level by level (see :mod:`backends.session`);
        raises LaunchFailed when it cannot come up."""

    def measure(self, launch: LaunchParams, workload: Workload) -> list[Measurement]:
        """Every level of ``workload`` in one launch, in order, one Measurement each; a launch
        that fails fails every level with its class and excerpt."""
        try:
            with self.session(launch, workload) as session:
                return [session.measure(c) for c in workload.concurrency]
        except LaunchFailed as error:
            return [Measurement.failed(c, error.failure, error.log_excerpt, self.predicts)
                    for c in workload.concurrency]


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """What a launch refuses before it starts, as the LaunchFailed a server would report."""
    try:
        yield
    except UnsupportedParams as error:
        raise LaunchFailed(FailureClass.UNSUPPORTED, str(error)) from error
    except InvalidParams as error:
        raise LaunchFailed(FailureClass.INVALID_CONFIG, str(error)) from error
