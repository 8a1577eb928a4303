"""``dflash-tune export``: every trial at every concurrency level, for spreadsheets and scripts.

CSV and Parquet hold one row per trial and level (a trial that reached no backend has one row
without a level), its parameters as columns; JSON nests the levels under each trial.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner import records
from tuner import render
from tuner.best import open_records
from tuner.config import Config
from tuner.errors import TunerError
from tuner.records import TrialRecord
from tuner.sla import SLA_METRICS

FORMATS = ("csv", "json", "parquet")
_LEVEL_COLUMNS = ("concurrency", *SLA_METRICS, "predicted", "failure")


class MissingDependency(TunerError):
    exit_code = 2


def export_study(cfg: Config, fmt: str, out: Path | None,
                 only: Sequence[int] | None = None) -> None:
    """Write the study of ``cfg`` (its trials numbered ``only``, if given) in ``fmt`` to
    ``out``, or to stdout."""
    db, _ = open_records(cfg.study.storage, cfg.study.name)
    trials = _numbered(records.load_trials(db, cfg.study.name), only, cfg.study.name)
    data = export(cfg.study.name, trials, fmt)
    if out is None:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    try:
        out.write_bytes(data)
    except OSError as err:
        raise TunerError(f"cannot write {out}: {err.strerror or err}") from None
    render.note(f"{len(trials)} trials of {cfg.study.name!r} written to {out}")


def _numbered(trials: list[TrialRecord], only: Sequence[int] | None,
              study: str) -> list[TrialRecord]:
    """The trials numbered ``only`` (all of them when None), in study order."""
    if not only:
        return trials
    held, wanted = {t.trial_number for t in trials}, set(only)
    if missing := sorted(wanted - held):
        span = f"trials {min(held)}-{max(held)}" if held else "no trials"
        raise TunerError(f"no trial {', '.join(map(str, missing))} in study {study!r} "
                         f"(it holds {span})")
    return [t for t in trials if t.trial_number in wanted]


def trial_dicts(study: str, trials: Sequence[TrialRecord]) -> list[dict[str, Any]]:
    """Each trial with its parameters, launch command and levels (nested: the JSON export, and
    what a dashboard overlay reads)."""
    return [{"study": study, "trial": t.trial_number, "status": t.status,
             "measured": t.measured, "backend": t.backend, "params": t.params,
             "command": t.command, "env": t.env, "log_excerpt": t.log_excerpt,
             "levels": _levels(t)} for t in trials]


def flat_rows(study: str, trials: Sequence[TrialRecord]) -> list[dict[str, Any]]:
    """One row per trial and level, every row with the same columns (missing ones None)."""
    names = sorted({k for t in trials for k in t.params})
    rows = []
    for t in trials:
        head = {"study": study, "trial": t.trial_number, "status": t.status,
                "measured": t.measured, "backend": t.backend,
                **{k: t.params.get(k) for k in names}}
        for level in _levels(t) or [{}]:
            rows.append({**head, **{k: level.get(k) for k in _LEVEL_COLUMNS},
                         "command": t.command})
    return rows


def _levels(t: TrialRecord) -> list[dict[str, Any]]:
    return [{"concurrency": c, **t.measurements[c]} for c in sorted(t.measurements)]


def export(study: str, trials: Sequence[TrialRecord], fmt: str) -> bytes:
    """The study's trials in ``fmt`` (one of FORMATS)."""
    if fmt == "json":
        doc = {"study": study, "trials": trial_dicts(study, trials)}
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    rows = flat_rows(study, trials)
    return _csv(rows) if fmt == "csv" else _parquet(rows)


def _csv(rows: list[dict[str, Any]]) -> bytes:
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue().encode()


def _parquet(rows: list[dict[str, Any]]) -> bytes:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependency("--format parquet needs pyarrow: pip install pyarrow "
                                "(or export csv or json)") from None
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()
