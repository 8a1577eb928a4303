"""Names in ``tuner.yaml`` that must be in a catalog: checked beside the schema, so that one run
reports every problem, each with a "did you mean" where a known name is close."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from functools import reduce
from pathlib import Path
from typing import Any

# Backends that measure a real engine: unless launch-aware tuning screens with the performance
# model, their GPU needs no catalog entry (any other backend's numbers come from that model).
MEASURED = ("sglang", "vllm", "serve", "inprocess")


def catalog_problems(raw: dict[str, Any], defaults: Any, flagged: set[str]) -> list[str]:
    """One ``field.path: ...`` line for each catalog name in ``raw`` (or, where ``raw`` has
    none, in ``defaults``: a ``Config``) that is unknown; ``flagged`` paths (already reported
    by the schema) are skipped."""
    def value(dotted: str) -> Any:
        return _value(raw, defaults, dotted)

    checks: list[tuple[str, Callable[[str], str | None]]] = [
        ("backend.name", _backend), ("model.name", _model)]
    if value("backend.name") not in MEASURED or value("tuning.strategy") == "launch_aware":
        checks.append(("hardware.gpu", _gpu))
    problems = []
    for dotted, check in checks:
        name = value(dotted)
        if not isinstance(name, str) or _flagged(dotted, flagged):
            continue
        problem = check(name)
        if problem:
            problems.append(f"{dotted}: {problem}")
    return problems


def _backend(name: str) -> str | None:
    from backends import BACKENDS

    return None if name in BACKENDS else _unknown("backend", name, sorted(BACKENDS), "available")


def _gpu(name: str) -> str | None:
    from backends.perf_model.catalog import hardware_names

    known = hardware_names()
    return None if name in known else _unknown("GPU", name, known, "known")


def _model(name: str) -> str | None:
    from backends.perf_model.catalog import model_names

    known = model_names()
    # A path is read where the model is needed (it may exist only on the serving node).
    if name in known or "/" in name or name.endswith(".json") or Path(name).exists():
        return None
    return _unknown("model", name, known, "not a config.json path either; catalog")


def _unknown(what: str, name: str, known: list[str], label: str) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown {what} {name!r}; {hint}{label}: {', '.join(known)}"


def _value(raw: dict[str, Any], defaults: Any, dotted: str) -> Any:
    keys, node = dotted.split("."), raw
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return reduce(getattr, keys, defaults)
        node = node[key]
    return node


def _flagged(dotted: str, flagged: set[str]) -> bool:
    parts = dotted.split(".")
    return any(".".join(parts[:i]) in flagged for i in range(1, len(parts) + 1))
