"""Nightly history, read by reflection: the table belongs to ``tuner.nightly`` and may change
shape, so nothing here assumes more than "rows with some numbers, maybe a time and a verdict".
(Today: one row per run, with ``status`` ok / regression / error / running, the incumbent's
``median`` and ``mad`` of ``metric``, and the baseline and reference medians it was judged by.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

TABLE = "dflash_tune_nightly"
MAX_ROWS = 500  # years of nightly runs; keeps a long-lived DB's report small
# Numbers that are counts or ids, not measurements.
_NOT_METRICS = {"id", "pid", "exit_code", "n_repeats", "repeats", "repeat", "run_id",
                "trial_number"}
# Long or internal columns left out of the table: the label says what params_json does, and a
# run's message names what changed in its environment fingerprint.
_NOT_SHOWN = {"id", "study", "study_name", "params_json", "fingerprint_json", "host", "pid",
              "finished_at"}
# What a reader looks for first; any other column follows in table order.
_FIRST = ("created_at", "status", "verdict", "message", "metric", "median", "mad",
          "baseline_median", "reference_median", "tolerance", "n_repeats", "config_label")


@dataclass(slots=True)
class NightlyHistory:
    rows: list[dict[str, Any]] = field(default_factory=list)  # oldest first
    columns: list[str] = field(default_factory=list)  # what the table shows
    metrics: list[str] = field(default_factory=list)  # numeric columns worth a line each
    note: str = ""


def load_nightly(engine: sa.Engine, study: str) -> NightlyHistory:
    """Never raises: a missing or unreadable table becomes the note shown in its place."""
    try:
        if not sa.inspect(engine).has_table(TABLE):
            return NightlyHistory(note="no nightly runs yet")
        rows = [_flatten(r) for r in _read(engine, study)]
    except sa.exc.SQLAlchemyError as err:
        return NightlyHistory(note=f"the nightly table could not be read: {err}")
    if not rows:
        return NightlyHistory(note="no nightly runs yet")
    columns = list(dict.fromkeys(k for r in rows for k in r))
    shown = [c for c in _FIRST if c in columns] + [c for c in columns if c not in _FIRST]
    return NightlyHistory(rows=rows, columns=[c for c in shown if c not in _NOT_SHOWN],
                          metrics=_metrics(rows, columns))


def _read(engine: sa.Engine, study: str) -> list[dict[str, Any]]:
    table = sa.Table(TABLE, sa.MetaData(), autoload_with=engine)
    query = sa.select(table)
    by_study = next((c for c in ("study", "study_name") if c in table.c), None)
    if by_study:
        query = query.where(table.c[by_study] == study)
    order = table.c.created_at if "created_at" in table.c else next(iter(table.primary_key), None)
    if order is not None:
        query = query.order_by(order.desc())
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(query.limit(MAX_ROWS)).mappings()]
    return rows[::-1]


def _flatten(row: dict[str, Any]) -> dict[str, Any]:
    """A JSON column holding an object of numbers only (``metrics_json``) becomes columns;
    anything else (a fingerprint of version strings) stays one cell."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        parsed = _json_object(value) if key.endswith("_json") else None
        if parsed and all(_is_number(v) for v in parsed.values()):
            prefix = key.removesuffix("_json")
            out.update({f"{prefix}.{k}": v for k, v in parsed.items()})
        else:
            out[key] = value
    return out


def _json_object(value: Any) -> dict[str, Any] | None:
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _metrics(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    def numeric(name: str) -> bool:
        values = [r.get(name) for r in rows if r.get(name) is not None]
        return bool(values) and all(_is_number(v) for v in values)

    return [c for c in columns if c not in _NOT_METRICS and numeric(c)]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def verdict(row: dict[str, Any]) -> str:
    return str(row.get("verdict", row.get("status", "")) or "")


def when(row: dict[str, Any], index: int) -> datetime | int:
    """The row's time, or its position when the table has none."""
    value = row.get("created_at")
    if isinstance(value, str):  # a DB or driver without a datetime type
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            pass
    return value if isinstance(value, datetime) else index
