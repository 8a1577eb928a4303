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
            "breakdown_json": json.dumps(f["breakdown_ms"]), "predicted": f["predicted"],
            "failure": f["failure"]}


def row_metrics(row: Mapping[str, Any]) -> dict[str, Any]:
    """A ``dflash_tune_measurements`` row as the metric name -> value dict a trial holds per
    concurrency level."""
    return {**{name: row[name] for name in METRICS}, "failure": row["failure"],
            "predicted": row["predicted"], "breakdown_ms": json.loads(row["breakdown_json"])}
