"""The one error type of the package."""

from __future__ import annotations


class SpaceError(ValueError):
    """A search space that cannot be loaded or evaluated.

    The message starts with the file and the path inside it
    (``space.yaml: params.speculative_ddtree_budget.low: ...``), so it can be printed as is.
    """
