"""Where a trial's parameters enter the tuner: a sampled or stored flat dict, parsed once into
the typed LaunchParams every backend takes."""

from __future__ import annotations

from typing import Any

from backends import InvalidParams
from backends import LaunchParams


def parse(params: dict[str, Any]) -> tuple[LaunchParams | None, str]:
    """``params`` as LaunchParams, or None and why not (a sample no engine can launch)."""
    try:
        return LaunchParams.from_params(params), ""
    except InvalidParams as error:
        return None, str(error)
