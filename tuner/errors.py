"""Errors the CLI knows how to explain: each maps to one line on stderr and an exit code."""

from __future__ import annotations


class TunerError(Exception):
    """A problem the user can fix; the message is shown as is."""

    exit_code = 1


class ConfigError(TunerError):
    exit_code = 2

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


class StorageError(TunerError):
    """The results DB cannot be opened or written; the message names the URL and the fix."""

    exit_code = 2


class InfeasibleSpaceError(TunerError):
    """The search space's constraints rejected (nearly) every sample: nothing left to measure."""

    exit_code = 2


class NoResultError(TunerError):
    """Nothing to choose from: an empty study, or every trial failed or broke the SLA."""

    exit_code = 1
