"""Nightly runs beside the study's records in the same DB (tables in ``tables.py``).

``dflash_tune_nightly`` holds one row per run (the dashboard's nightly view reads it);
``dflash_tune_nightly_measurements`` one row per repeat of each configuration, committed as soon
as it is measured, so a run that dies loses nothing it measured. A run is written as 'running'
first; one that never finished stays 'running' until the next run marks it 'error' (abandoned)
and, like every run that did not finish 'ok', it is never used as history.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING
from typing import Any

import sqlalchemy as sa

from backends import Measurement
from tuner.records.serialize import measurement_fields
from tuner.records.serialize import storable_text
from tuner.records.tables import connect  # noqa: F401  (re-exported: what a nightly run opens)
from tuner.records.tables import nightly_repeats as repeats
from tuner.records.tables import nightly_runs as runs
from tuner.records.tables import now
from tuner.stats import median

if TYPE_CHECKING:  # records sit below tuner.nightly; a probe is only read here
    from tuner.nightly.plan import Probe

RUNNING, OK, REGRESSION, ERROR = "running", "ok", "regression", "error"


@dataclass(slots=True, frozen=True)
class OpenRun:
    id: int
    host: str
    pid: int
    created_at: datetime


def start_run(db: sa.Engine, study: str, label: str, params: dict[str, Any], metric: str,
              fingerprint: dict[str, Any], pid: int, rebased: bool) -> int:
    """The 'running' row, written before anything is measured."""
    row = {"study": study, "created_at": now(), "status": RUNNING, "config_label": label,
           "params_json": json.dumps(params, sort_keys=True), "metric": metric,
           "fingerprint_json": json.dumps(fingerprint, sort_keys=True),
           "message": "", "host": fingerprint["host"], "pid": pid, "rebased": rebased}
    with db.begin() as conn:
        return conn.execute(runs.insert().values(**row)).inserted_primary_key[0]


def save_repeat(db: sa.Engine, run_id: int, study: str, probe: Probe, repeat: int,
                rows: Sequence[Measurement], target: int, failure: str | None) -> None:
    """One repeat of one configuration, committed at once."""
    by_level = {m.concurrency: m for m in rows}
    at_target, at_one = by_level.get(target), by_level.get(1)
    row = {"run_id": run_id, "study": study, "role": probe.role, "config_key": probe.key,
           "config_label": probe.label, "params_json": json.dumps(probe.params, sort_keys=True),
           "repeat": repeat, "failure": failure, "created_at": now(),
           "output_tok_s": None if failure or not at_target else at_target.output_tok_s,
           "tok_s_per_user": None if failure or not at_one else at_one.tok_s_per_user,
           "metrics_json": json.dumps({m.concurrency: measurement_fields(m) for m in rows})}
    with db.begin() as conn:
        conn.execute(repeats.insert().values(**row))


def finish_run(db: sa.Engine, run_id: int, status: str, message: str, **numbers: Any) -> None:
    with db.begin() as conn:
        conn.execute(runs.update().where(runs.c.id == run_id).values(
            status=status, message=storable_text(message), finished_at=now(), **numbers))


def open_runs(db: sa.Engine, study: str) -> list[OpenRun]:
    """Runs of ``study`` still marked 'running' (live elsewhere, or dead)."""
    query = sa.select(runs.c.id, runs.c.host, runs.c.pid, runs.c.created_at).where(
        runs.c.study == study, runs.c.status == RUNNING)
    with db.connect() as conn:
        return [OpenRun(*row) for row in conn.execute(query)]


def kept(db: sa.Engine, run_id: int) -> int:
    """How many repeats a run stored."""
    with db.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).where(repeats.c.run_id == run_id)).scalar()


def abandon(db: sa.Engine, run: OpenRun) -> int:
    """Mark a dead run 'error'; returns how many measurements it had kept."""
    count = kept(db, run.id)
    with db.begin() as conn:
        # Only if still 'running': it may have finished since it was listed.
        conn.execute(runs.update().where(runs.c.id == run.id, runs.c.status == RUNNING).values(
            status=ERROR, finished_at=now(),
            message=f"abandoned: stopped without finishing (killed or crashed); its {count} "
                    "measurements are kept but not used as history"))
    return count


def finished_runs(db: sa.Engine, study: str) -> int:
    query = sa.select(sa.func.count()).where(runs.c.study == study, runs.c.status != RUNNING)
    with db.connect() as conn:
        return conn.execute(query).scalar()


def last_fingerprint(db: sa.Engine, study: str) -> dict[str, Any] | None:
    """The fingerprint of the newest run that measured something to compare against."""
    query = (sa.select(runs.c.fingerprint_json)
             .where(runs.c.study == study, runs.c.status.in_((OK, REGRESSION)))
             .order_by(runs.c.id.desc()).limit(1))
    with db.connect() as conn:
        raw = conn.execute(query).scalar()
    return json.loads(raw) if raw else None


def history(db: sa.Engine, study: str, key: str, column: str,
            limit: int) -> list[tuple[float, int]]:
    """(median, repeats) of ``column`` for configuration ``key`` in the newest ``limit`` 'ok'
    runs that measured it, not reaching past the newest rebased run. Runs that regressed are
    left out so that a regression cannot become its own reference by repetition."""
    with db.connect() as conn:
        ok_runs = conn.execute(sa.select(runs.c.id, runs.c.rebased).where(
            runs.c.study == study, runs.c.status == OK).order_by(runs.c.id.desc())).all()
        window = _until_rebased(ok_runs)
        values = conn.execute(sa.select(repeats.c.run_id, repeats.c[column]).where(
            repeats.c.run_id.in_(window), repeats.c.config_key == key,
            repeats.c.failure.is_(None), repeats.c[column].is_not(None))).all()
    by_run: dict[int, list[float]] = {}
    for run_id, value in values:
        by_run.setdefault(run_id, []).append(value)
    ordered = [by_run[run_id] for run_id in window if run_id in by_run][:limit]
    return [(median(v), len(v)) for v in ordered]


def _until_rebased(newest_first: Sequence[tuple[int, bool]]) -> list[int]:
    window = []
    for run_id, rebased in newest_first:
        window.append(run_id)
        if rebased:
            break
    return window
