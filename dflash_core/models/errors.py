"""The one error a checkpoint or its config raises (a leaf: every config module can raise it)."""


class CheckpointError(ValueError):
    """A checkpoint or its config does not match what the engine expects."""
