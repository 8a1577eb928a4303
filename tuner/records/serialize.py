"""A ``Measurement`` to and from what the tables store: one set of fields for both tables.

A nightly repeat stores every field as JSON (``metrics_json``); a trial's measurement row puts
the same fields in columns of their own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from backends import Measurement
from tuner.records.tables import METRICS

LOG_CHARS = 2000  # the end of a log says why it failed; more only bloats the DB


def storable_text(text: str) -> str:
    """``text`` as every DB stores it: PostgreSQL refuses a NUL character in a text column (a
    server's log may hold one), so each becomes U+FFFD."""
    return text.replace("\x00", "\ufffd")


def measurement_fields(m: Measurement) -> dict[str, Any]:
    """Every field of ``m``, JSON-ready (the failure class as its value)."""
    fields = m.to_dict()
    fields["log_excerpt"] = m.log_excerpt[-LOG_CHARS:]
    return fields


def measurement_row(m: Measurement) -> dict[str, Any]:
    """``m`` as the columns of ``dflash_tune_measurements`` (the trial's keys left to the
    caller); the log excerpt is the trial's, not stored per level."""
    f = measurement_fields(m)
    hist = f["accept_len_hist"]
    return {"concurrency": f["concurrency"], **{name: f[name] for name in METRICS},
            "accept_len_hist_json": json.dumps(hist) if hist else None,
            "breakdown_json": json.dumps(_breakdown(f)), "predicted": f["predicted"],
            "failure": f["failure"]}


def row_metrics(row: Mapping[str, Any]) -> dict[str, Any]:
    """A ``dflash_tune_measurements`` row as the metric name -> value dict a trial holds per
    concurrency level."""
    return {**{name: row[name] for name in METRICS}, "failure": row["failure"],
            "predicted": row["predicted"], **_read_breakdown(row["breakdown_json"])}


def _breakdown(f: Mapping[str, Any]) -> dict[str, Any]:
    """The breakdown as stored: the plain ``{component: ms}`` of a backend that knows only
    times, or ``{"ms": ..., "source": ..., "sol_pct": ...}`` of one that knows more."""
    if not f["breakdown_source"]:
        return f["breakdown_ms"]
    return {"ms": f["breakdown_ms"], "source": f["breakdown_source"],
            "sol_pct": f["breakdown_sol_pct"]}


def _read_breakdown(text: str) -> dict[str, Any]:
    stored = json.loads(text)
    if isinstance(stored.get("ms"), dict):
        return {"breakdown_ms": stored["ms"], "breakdown_source": stored.get("source") or {},
                "breakdown_sol_pct": stored.get("sol_pct") or {}}
    return {"breakdown_ms": stored, "breakdown_source": {}, "breakdown_sol_pct": {}}
