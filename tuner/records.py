"""Our own tables beside Optuna's in the same database.

``best``, dashboards and nightly runs read only these: what each trial ran (params, the rendered
launch command), what came of it (one row per concurrency level), and the config of the study.
They are written in one transaction per trial, so an interrupted run leaves no half trial.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from datetime import timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from backends.base import Measurement

metadata = sa.MetaData()

studies = sa.Table(
    "dflash_tune_studies", metadata,
    sa.Column("name", sa.String(512), primary_key=True),
    sa.Column("config_json", sa.Text, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
)

trials = sa.Table(
    "dflash_tune_trials", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("study", sa.String(512), nullable=False, index=True),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("backend", sa.String(64), nullable=False),
    sa.Column("params_json", sa.Text, nullable=False),
    sa.Column("status", sa.String(32), nullable=False),  # "ok" or a FailureClass value
    # False for samples the search space rejected before any backend saw them.
    sa.Column("measured", sa.Boolean, nullable=False),
    sa.Column("command", sa.Text, nullable=False),  # shell-quoted launch command, "" if none
    sa.Column("env_json", sa.Text, nullable=False),
    sa.Column("log_excerpt", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.UniqueConstraint("study", "trial_number"),
)

_METRICS = ("output_tok_s", "output_tok_s_per_gpu", "tok_s_per_user", "ttft_p50_ms",
            "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms",
            "accept_len_mean", "peak_mem_gib")

measurements = sa.Table(
    "dflash_tune_measurements", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("study", sa.String(512), nullable=False, index=True),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("concurrency", sa.Integer, nullable=False),
    *(sa.Column(name, sa.Float) for name in _METRICS),
    sa.Column("accept_len_hist_json", sa.Text),
    sa.Column("breakdown_json", sa.Text, nullable=False),
    sa.Column("predicted", sa.Boolean, nullable=False),
    sa.Column("failure", sa.String(32)),
)


# Log excerpt of a launch whose integrity gates all passed (launch-aware studies choose only
# configurations with such a launch).
GATES_PASSED = "gates passed"


# The configuration a launch-aware study's finals crowned (the latest row counts): `best` names it
# rather than re-ranking the gated finalists by their runs alone.
winners = sa.Table(
    "dflash_tune_winners", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("study", sa.String(512), nullable=False, index=True),
    sa.Column("params_json", sa.Text, nullable=False),
    sa.Column("decided_at", sa.DateTime, nullable=False),
)


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

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def missing_sqlite_file(url: str) -> str | None:
    """The path of a SQLite DB file that does not exist yet (reading it would create it)."""
    parsed = sa.engine.make_url(url)
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return None
    return None if Path(path).exists() else path


def connect(url: str) -> sa.Engine:
    """Engine for ``url`` with our tables created; SQLite waits on locks instead of failing."""
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": 60}
    engine = sa.create_engine(url, **kwargs)
    metadata.create_all(engine)
    return engine


def save_study_config(engine: sa.Engine, name: str, config: dict[str, Any]) -> None:
    row = {"name": name, "config_json": json.dumps(config), "updated_at": _now()}
    with engine.begin() as conn:
        conn.execute(studies.delete().where(studies.c.name == name))
        conn.execute(studies.insert().values(**row))


def load_study_config(engine: sa.Engine, name: str) -> dict[str, Any] | None:
    with engine.connect() as conn:
        raw = conn.execute(sa.select(studies.c.config_json).where(studies.c.name == name)).scalar()
    return json.loads(raw) if raw else None


def study_names(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(studies.c.name).order_by(studies.c.name)).scalars())


def save_winner(engine: sa.Engine, study: str, params: dict[str, Any]) -> None:
    with engine.begin() as conn:
        conn.execute(winners.insert().values(study=study, decided_at=_now(),
                                             params_json=json.dumps(params, sort_keys=True)))


def load_winner(engine: sa.Engine, study: str) -> dict[str, Any] | None:
    query = (sa.select(winners.c.params_json).where(winners.c.study == study)
             .order_by(winners.c.id.desc()).limit(1))
    with engine.connect() as conn:
        row = conn.execute(query).scalar()
    return json.loads(row) if row else None


def save_trial(engine: sa.Engine, study: str, record: TrialRecord,
               rows: Sequence[Measurement]) -> None:
    trial_row = {
        "study": study, "trial_number": record.trial_number, "backend": record.backend,
        "params_json": json.dumps(record.params, sort_keys=True), "status": record.status,
        "measured": record.measured,
        "command": record.command, "env_json": json.dumps(record.env),
        "log_excerpt": record.log_excerpt, "created_at": _now(),
    }
    with engine.begin() as conn:
        conn.execute(trials.insert().values(**trial_row))
        if rows:
            conn.execute(measurements.insert(), [_measurement_row(study, record, m) for m in rows])


def load_trials(engine: sa.Engine, study: str) -> list[TrialRecord]:
    with engine.connect() as conn:
        trial_rows = conn.execute(sa.select(trials).where(trials.c.study == study)
                                  .order_by(trials.c.trial_number)).mappings().all()
        m_rows = conn.execute(sa.select(measurements)
                              .where(measurements.c.study == study)).mappings().all()
    by_trial: dict[int, dict[int, dict[str, Any]]] = {}
    for m in m_rows:
        metrics = {name: m[name] for name in _METRICS}
        metrics["failure"] = m["failure"]
        metrics["predicted"] = m["predicted"]
        metrics["breakdown_ms"] = json.loads(m["breakdown_json"])
        by_trial.setdefault(m["trial_number"], {})[m["concurrency"]] = metrics
    return [TrialRecord(
        trial_number=t["trial_number"], backend=t["backend"], params=json.loads(t["params_json"]),
        status=t["status"], measured=t["measured"], command=t["command"],
        env=json.loads(t["env_json"]),
        log_excerpt=t["log_excerpt"], measurements=by_trial.get(t["trial_number"], {}),
    ) for t in trial_rows]


def _measurement_row(study: str, record: TrialRecord, m: Measurement) -> dict[str, Any]:
    return {
        "study": study, "trial_number": record.trial_number, "concurrency": m.concurrency,
        **{name: getattr(m, name) for name in _METRICS},
        "accept_len_hist_json": json.dumps(m.accept_len_hist) if m.accept_len_hist else None,
        "breakdown_json": json.dumps(m.breakdown_ms), "predicted": m.predicted,
        "failure": m.failure.value if m.failure else None,
    }


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)
