"""Errors the CLI knows how to explain: each maps to one line on stderr and an exit code."""

from __future__ import annotations


class TunerError(Exception):
    """A problem the user can fix; the message is shown as is."""

    exit_code = 1


class UsageError(TunerError, ValueError):
    """A value the command cannot use (a ValueError too, so pydantic reports it in a config)."""

    exit_code = 2


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


def user_error_code(error: BaseException) -> int | None:
    """The exit code of an error the user can fix (one line is shown), None for anything else:
    a bug."""
    from backends.errors import is_user_error
    from search_spaces.errors import SpaceError

    if isinstance(error, TunerError):
        return error.exit_code
    if is_user_error(error) or isinstance(error, (SpaceError, FileNotFoundError)):
        return 2
    return None
