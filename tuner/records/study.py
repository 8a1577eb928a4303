"""A study's records: its config, what each trial ran (params, the rendered launch command),
what came of it (one row per concurrency level), and the winner its finals crowned.

``best``, dashboards and nightly runs read only these. A trial is written in one transaction,
so an interrupted run leaves no half trial.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from backends import LaunchParams
from backends import Measurement
from tuner.records.serialize import measurement_row
from tuner.records.serialize import row_metrics
from tuner.records.serialize import storable_text
from tuner.records.stored import json_value
from tuner.records.stored import numbers
from tuner.records.stored import reading
from tuner.records.tables import METRICS
from tuner.records.tables import has_table
from tuner.records.tables import measurements
from tuner.records.tables import now
from tuner.records.tables import studies
from tuner.records.tables import trials
from tuner.records.tables import winners
from tuner.params import parse

# Log excerpt of a launch whose integrity gates all passed (launch-aware studies choose only
# configurations with such a launch).
GATES_PASSED = "gates passed"


@dataclass(slots=True)
class TrialRecord:
    trial_number: int
    backend: str
    params: dict[str, Any]
    status: str
    measured: bool
    command: str
    env: dict[str, str]
    log_excerpt: str
    measurements: dict[int, dict[str, Any]]  # concurrency -> metric name -> value
    # ``params`` parsed when read back; None for a sample no engine could launch.
    launch: LaunchParams | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def engine_measured(self) -> bool:
        """A real engine measured a level of it (the performance model predicts its rows)."""
        return any(not row.get("predicted", True) for row in self.measurements.values())


def save_study_config(engine: sa.Engine, name: str, config: dict[str, Any]) -> None:
    row = {"name": name, "config_json": json.dumps(config), "updated_at": now()}
    with engine.begin() as conn:
        conn.execute(studies.delete().where(studies.c.name == name))
        conn.execute(studies.insert().values(**row))


def load_study_config(engine: sa.Engine, name: str) -> dict[str, Any] | None:
    with reading(engine), engine.connect() as conn:
        row = conn.execute(sa.select(studies.c.config_json).where(studies.c.name == name)).first()
    return row and json_value(engine, studies, f"study {name!r}", row._mapping, "config_json")


def study_names(engine: sa.Engine) -> list[str]:
    with reading(engine), engine.connect() as conn:
        return list(conn.execute(sa.select(studies.c.name).order_by(studies.c.name)).scalars())


def save_winner(engine: sa.Engine, study: str, params: dict[str, Any]) -> None:
    with engine.begin() as conn:
        conn.execute(winners.insert().values(study=study, decided_at=now(),
                                             params_json=json.dumps(params, sort_keys=True)))


def load_winner(engine: sa.Engine, study: str) -> dict[str, Any] | None:
    if not has_table(engine, winners):
        return None
    query = (sa.select(winners.c.params_json).where(winners.c.study == study)
             .order_by(winners.c.id.desc()).limit(1))
    with reading(engine), engine.connect() as conn:
        row = conn.execute(query).first()
    params = row and json_value(engine, winners, f"study {study!r}", row._mapping, "params_json")
    return stored_params(params) if params else None


def save_trial(engine: sa.Engine, study: str, record: TrialRecord,
               rows: Sequence[Measurement]) -> None:
    trial_row = {
        "study": study, "trial_number": record.trial_number, "backend": record.backend,
        "params_json": json.dumps(record.params, sort_keys=True), "status": record.status,
        "measured": record.measured,
        "command": storable_text(record.command), "env_json": json.dumps(record.env),
        "log_excerpt": storable_text(record.log_excerpt), "created_at": now(),
    }
    with engine.begin() as conn:
        conn.execute(trials.insert().values(**trial_row))
        if rows:
            keys = {"study": study, "trial_number": record.trial_number}
            conn.execute(measurements.insert(), [{**keys, **measurement_row(m)} for m in rows])


def load_trials(engine: sa.Engine, study: str) -> list[TrialRecord]:
    with reading(engine), engine.connect() as conn:
        trial_rows = conn.execute(sa.select(trials).where(trials.c.study == study)
                                  .order_by(trials.c.trial_number)).mappings().all()
        m_rows = conn.execute(sa.select(measurements)
                              .where(measurements.c.study == study)).mappings().all()
    by_trial: dict[int, dict[int, dict[str, Any]]] = {}
    for m in m_rows:
        by_trial.setdefault(m["trial_number"], {})[m["concurrency"]] = _level(engine, study, m)
    return [_trial(engine, study, t, by_trial.get(t["trial_number"], {})) for t in trial_rows]


def _level(engine: sa.Engine, study: str, row: Any) -> dict[str, Any]:
    where = f"study {study!r}, trial {row['trial_number']}, concurrency {row['concurrency']}"
    numbers(engine, measurements, where, row, ("trial_number", "concurrency", *METRICS))
    json_value(engine, measurements, where, row, "breakdown_json")
    json_value(engine, measurements, where, row, "accept_len_hist_json", list)
    return row_metrics(row)


def _trial(engine: sa.Engine, study: str, row: Any, levels: dict[int, dict[str, Any]]
           ) -> TrialRecord:
    where = f"study {study!r}, trial {row['trial_number']}"
    numbers(engine, trials, where, row, ("trial_number",))
    params = stored_params(json_value(engine, trials, where, row, "params_json"))
    return TrialRecord(
        trial_number=row["trial_number"], backend=row["backend"], params=params,
        status=row["status"], measured=row["measured"], command=row["command"],
        env=json_value(engine, trials, where, row, "env_json"), log_excerpt=row["log_excerpt"],
        measurements=levels, launch=parse(params)[0])


def stored_params(params: dict[str, Any]) -> dict[str, Any]:
    """A trial's parameters as stored, in today's meanings: a round cap of 0, which studies
    recorded while 0 meant "no cap", is None."""
    if params.get("speculative_ddtree_round_tokens") == 0:
        return {**params, "speculative_ddtree_round_tokens": None}
    return params
