"""Several ``dflash-tune run`` workers on one study: exactly ``n_trials`` measured trials between
them, and a killed worker's trial retried by another. Real processes on a real PostgreSQL (and
SQLite, which needs no server)."""

from __future__ import annotations

import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import optuna
import sqlalchemy as sa
from cli_helpers import write_config
from plain_space import write_plain_space
from workers import finished
from workers import records_of
from workers import running_trial_of
from workers import trials_of
from workers import wait_until
from workers import worker

from tuner import records
from tuner.budget import WORKER_KEY
from tuner.budget import RetryUnrecorded
from tuner.config import StudyConfig
from tuner.study import MEASURED_KEY

STUDY = "pcie8-kimi-sglang"
N = 10
FINISHED = {"COMPLETE", "PRUNED", "FAIL"}
# Each level walk prices hundreds of configurations, every one slowed here: the budget is what
# these tests count (the walks have tests/tuner_tests/test_level_search.py).
NO_WALKS = {"level_search": False}


def _worker(folder: Path, url: str, trials: int, delay_s: float) -> subprocess.Popen:
    return worker(folder, url, delay_s, "--trials", str(trials))


def _finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    """Trials this worker ran, and its stderr; it must have exited 0."""
    err = finished(proc, timeout)
    return int(re.search(r"(\d+) trials run", err).group(1)), err


def _trials(url: str) -> list[optuna.trial.FrozenTrial]:
    return trials_of(url, STUDY)


def _records(url: str) -> dict[int, bool]:
    return records_of(url, STUDY)


def _assert_exact(url: str, target: int) -> list[optuna.trial.FrozenTrial]:
    """The study holds ``target`` measured trials, each recorded once, none left running."""
    trials, recorded = _trials(url), _records(url)
    assert {t.state.name for t in trials} <= FINISHED
    assert len({t.number for t in trials}) == len(trials)
    measured = [t for t in trials if t.user_attrs.get(MEASURED_KEY)]
    assert len(measured) == sum(recorded.values()) == target
    # Completed (measured or rejected: PRUNED, once the objective prunes rejected samples) and
    # transient failures have their one record; a killed or interrupted trial has none.
    told = {t.number for t in trials
            if t.state.name in ("COMPLETE", "PRUNED") or t.user_attrs.get(MEASURED_KEY)}
    assert set(recorded) == told
    return trials


def _two_workers_share_the_budget(folder: Path, url: str) -> None:
    write_config(folder, tuning=NO_WALKS)
    # Measurements slow enough that neither worker can finish the study before the other starts.
    workers = [_worker(folder, url, 2 * N, delay_s=0.25) for _ in range(2)]
    ran = [_finish(w)[0] for w in workers]
    assert sum(ran) == 2 * N
    trials = _assert_exact(url, 2 * N)
    by_worker = Counter(t.user_attrs[WORKER_KEY] for t in trials
                        if t.user_attrs.get(MEASURED_KEY))
    assert len(by_worker) == 2  # both measured: the budget really was shared


def test_two_postgres_workers_finish_exactly_the_budget(pg, tmp_path):
    _two_workers_share_the_budget(tmp_path, pg.create_database("two_workers"))


def test_two_sqlite_workers_finish_exactly_the_budget(tmp_path):
    _two_workers_share_the_budget(tmp_path, f"sqlite:///{tmp_path / 'results.db'}")


def test_two_workers_on_one_seed_measure_different_configurations(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    write_config(tmp_path, search_space=str(write_plain_space(tmp_path)), study={"seed": 7},
                 tuning=NO_WALKS)
    workers = [_worker(tmp_path, url, N, delay_s=0.25) for _ in range(2)]
    ran = [_finish(w)[0] for w in workers]
    assert sum(ran) == N and min(ran) > 0  # both sampled
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        params = conn.execute(sa.text("select params_json from dflash_tune_trials where "
                                      "measured")).scalars().all()
    engine.dispose()
    assert len(params) == N and len(set(params)) == N, "a configuration was measured twice"


def test_killed_workers_trial_is_failed_and_retried_by_another(pg, tmp_path):
    url, target = pg.create_database("killed_worker"), 4
    # Stale after 2 s without a heartbeat.
    write_config(tmp_path, study={"heartbeat_s": 1}, tuning=NO_WALKS)
    victim = _worker(tmp_path, url, target, delay_s=600)  # every trial it starts hangs
    killed = running_trial_of(victim, url, STUDY)
    survivor = _worker(tmp_path, url, target, delay_s=0.1)
    wait_until(lambda: sum(_records(url).values()) == target - 1)
    # Now the survivor waits: the last of the budget is the victim's trial, still heartbeating.
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=10)
    ran, err = _finish(survivor)
    assert ran == target and "waiting until those trials finish" in err
    trials = _assert_exact(url, target)
    dead = trials[killed.number]
    assert dead.state.name == "FAIL" and dead.number not in _records(url)
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == dead.number]
    assert [t.state.name for t in retries] == ["COMPLETE"]
    assert retries[0].params == dead.params and retries[0].user_attrs[MEASURED_KEY]


def test_a_dead_workers_saved_measurement_stands_and_only_a_lost_one_is_retried(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    engine = records.connect(url)
    study = optuna.create_study(study_name="s", storage=url, directions=["maximize"] * 2)
    saved, lost = (study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
                   for _ in range(2))
    records.save_trial(engine, "s", records.TrialRecord(
        trial_number=saved.number, backend="model", params=saved.params, status="ok",
        measured=True, command="", env={}, log_excerpt="", measurements={}), [])
    retry = RetryUnrecorded(engine, "s", max_retries=3)
    for trial in (saved, lost):  # both died; only one had saved its measurement
        trial.set_user_attr(WORKER_KEY, "gone:1")
        retry(study, study.get_trials()[trial.number])
    [copy] = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert copy.system_attrs["failed_trial"] == lost.number and copy.params == lost.params
    assert WORKER_KEY not in copy.user_attrs  # not in flight before its new worker marks it


def test_bare_postgresql_url_means_the_psycopg2_driver():
    study = StudyConfig(storage="postgresql://u@db.example:5432/tune")
    assert study.storage == "postgresql+psycopg2://u@db.example:5432/tune"
    assert StudyConfig(storage="postgresql+psycopg://h/d").storage == "postgresql+psycopg://h/d"
