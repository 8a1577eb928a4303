"""Nightly history for the dashboard: one row per ``dflash-tune nightly`` run, with ``status``
ok / regression / error / running, the incumbent's ``median`` and ``mad`` of ``metric``, and the
baseline and reference medians and the tolerance it was judged by.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from tuner.records.tables import nightly_runs

TABLE = nightly_runs.name
MAX_ROWS = 500  # years of nightly runs; keeps a long-lived DB's report small
# What the table shows, what a reader looks for first leading. Left out: ids, where the run
# lived, params_json (the label says it) and the fingerprint (a run's message names what
# changed in it).
COLUMNS = ("created_at", "status", "message", "metric", "median", "mad", "baseline_median",
           "reference_median", "tolerance", "n_repeats", "config_label", "rebased")
# Numbers worth a line each (n_repeats is a count, not a measurement).
METRICS = ("median", "mad", "baseline_median", "reference_median", "tolerance")


@dataclass(slots=True)
class NightlyHistory:
    rows: list[dict[str, Any]] = field(default_factory=list)  # oldest first
    columns: list[str] = field(default_factory=list)  # what the table shows
    metrics: list[str] = field(default_factory=list)  # numeric columns worth a line each
    note: str = ""


def load_nightly(engine: sa.Engine, study: str) -> NightlyHistory:
    """Never raises: an unreadable table becomes the note shown in its place."""
    try:
        rows = _read(engine, study)
    except sa.exc.SQLAlchemyError as err:
        return NightlyHistory(note=f"the nightly table could not be read: {err}")
    if not rows:
        return NightlyHistory(note="no nightly runs yet")
    metrics = [m for m in METRICS if any(r[m] is not None for r in rows)]
    return NightlyHistory(rows=rows, columns=list(COLUMNS), metrics=metrics)


def _read(engine: sa.Engine, study: str) -> list[dict[str, Any]]:
    t = nightly_runs
    query = (sa.select(*(t.c[name] for name in COLUMNS)).where(t.c.study == study)
             .order_by(t.c.created_at.desc(), t.c.id.desc()).limit(MAX_ROWS))
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(query).mappings()]
    return rows[::-1]


def verdict(row: dict[str, Any]) -> str:
    return str(row.get("status") or "")


def when(row: dict[str, Any], index: int) -> datetime | int:
    """The row's time (its position if it has none)."""
    return row.get("created_at") or index
