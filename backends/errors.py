"""The backends' one user-error type: input the user can fix (a launch no engine can run, an
unknown GPU or model, a bad checkpoint path or prompt). The command line prints its message as
one line; any other exception out of a backend is a bug and is reported as one."""

from __future__ import annotations


class UserError(ValueError):
    """Input the user can fix; the message says what and how."""


def is_user_error(error: BaseException) -> bool:
    """Whether ``error`` is input the user can fix: a UserError, or a checkpoint the engine
    refuses (dflash_core's CheckpointError, which cannot know this type)."""
    from dflash_core.models.errors import CheckpointError

    return isinstance(error, (UserError, CheckpointError))
