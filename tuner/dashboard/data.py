"""A study's results as plain values: what each trial ran and measured, and what ``best`` chose.

Everything here comes from our own tables; the views in ``figures`` never touch the DB.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import Any

import sqlalchemy as sa

from backends.launch_params import LaunchParams
from tuner import records
from tuner.config import Config
from tuner.crossover import Crossover
from tuner.crossover import envelopes
from tuner.crossover import family_of
from tuner.crossover import study_crossover
from tuner.errors import NoResultError
from tuner.records import TrialRecord
from tuner.selection import candidates
from tuner.selection import config_key


@dataclass(slots=True)
class TrialView:
    number: int
    status: str  # "ok" or a failure class
    measured: bool
    params: dict[str, Any]
    label: str
    family: str | None  # None when the params are not a launchable configuration
    levels: dict[int, dict[str, Any]]  # concurrency -> metric name -> value
    command: str
    log_excerpt: str
    feasible: bool = False  # its configuration succeeded within the SLA where `best` reads it
    launch: LaunchParams | None = None  # the params parsed; None when they are not launchable

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def metric(self, concurrency: int, name: str) -> float | None:
        return self.levels.get(concurrency, {}).get(name)


@dataclass(slots=True)
class StudyData:
    name: str
    storage: str  # the URL with any password hidden
    backend: str  # what measured the trials ("model", "sglang", ...); "" before any trial
    model_path: str
    target: int  # concurrency the throughput objective and the SLA apply at
    gpus: int
    sla: list[str]
    trials: list[TrialView]
    config: Config
    chosen: int | None = None  # trial number `best` would emit
    front: list[int] = field(default_factory=list)  # feasible Pareto front, best throughput first
    choice_note: str = ""  # why nothing was chosen
    # What `best` read for the chosen one: throughput (median over its runs) and where.
    chosen_tok_s: float = 0.0
    chosen_runs: int = 1
    chosen_where: str = ""
    # Per family, the best output tok/s at each level, and where speculation stops paying.
    curves: dict[str, dict[int, float]] = field(default_factory=dict)
    crossover: Crossover | None = None

    def trial(self, number: int) -> TrialView:
        return next(t for t in self.trials if t.number == number)

    @property
    def ok_trials(self) -> list[TrialView]:
        return [t for t in self.trials if t.ok and t.levels]


def load_study_data(storage_url: str, study: str) -> StudyData:
    """Read one study; NoResultError when the DB or the study does not exist."""
    engine = records.open_results(storage_url)
    try:
        stored = records.load_study_config(engine, study)
        trial_records = records.load_trials(engine, study)
        known = ", ".join(records.study_names(engine)) or "none"
    finally:
        engine.dispose()
    if stored is None and not trial_records:
        raise NoResultError(f"no study named {study!r} in {_hidden(storage_url)} "
                            f"(studies: {known}); run `dflash-tune run` first")
    cfg = _config(stored, storage_url, study)
    curves = envelopes(trial_records)
    data = StudyData(
        name=study, storage=_hidden(storage_url),
        backend=trial_records[-1].backend if trial_records else cfg.backend.name,
        model_path=cfg.model.path, target=cfg.workload.target_concurrency,
        gpus=cfg.hardware.gpus, sla=list(cfg.workload.sla),
        trials=[_view(t) for t in trial_records], config=cfg,
        curves=curves, crossover=study_crossover(trial_records, cfg))
    _mark_feasible(data, trial_records)
    _choose(data, cfg)
    return data


def _config(stored: dict[str, Any] | None, storage_url: str, study: str) -> Config:
    """The config the study ran with, pointed at the DB we were given (the stored storage URL
    may be relative to another working directory)."""
    try:
        cfg = Config.model_validate(stored or {})
    except ValueError:  # written by an older version; the defaults still draw a report
        cfg = Config()
    cfg.study = cfg.study.model_copy(update={"storage": storage_url, "name": study})
    return cfg


def _view(t: TrialRecord) -> TrialView:
    lp = t.launch  # None: unknown or wrongly typed params from another space
    label, family = (lp.label(), family_of(lp)) if lp else ("not launchable", None)
    return TrialView(number=t.trial_number, status=t.status, measured=t.measured,
                     params=t.params, launch=lp, label=label, family=family,
                     levels=t.measurements, command=t.command, log_excerpt=t.log_excerpt)


def _mark_feasible(data: StudyData, trial_records: list[TrialRecord]) -> None:
    from tuner.best import ranking_of

    ranking = ranking_of(data.config, trial_records)
    keys = {config_key(c.params) for c in candidates(trial_records, data.target,
                                                     data.config.workload.limits, ranking)}
    feasible = {t.trial_number for t in trial_records if t.ok and config_key(t.params) in keys}
    for t in data.trials:
        t.feasible = t.number in feasible


def _choose(data: StudyData, cfg: Config) -> None:
    """Exactly what `best` picks, so the report and the emitted flags never disagree."""
    from tuner.best import find_best

    try:
        result = find_best(cfg, None, None)
    except (NoResultError, ValueError) as err:
        data.choice_note = str(err)
        return
    data.chosen = result.chosen.trial.trial_number
    data.front = [c.trial.trial_number for c in result.front]
    data.chosen_tok_s, data.chosen_runs = result.chosen.throughput, result.chosen.runs
    data.chosen_where = ("at its SLA limit" if result.ranking.point == "at_sla_limit"
                         else f"at concurrency {data.target}")


def _hidden(url: str) -> str:
    return sa.engine.make_url(url).render_as_string(hide_password=True)
