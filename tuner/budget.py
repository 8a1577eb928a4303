"""What counts against ``n_trials`` when several workers share a study, and what is retried.

A trial counts once its measurement is in our records (``records.save_trial``, one transaction
with a unique (study, trial_number) row): that is what ``best`` reads, so records are the one
count. A worker may start a trial only while measured + in flight < n_trials, decided under the
claim lock (``tuner.claim_lock``), so all workers together never start more than the budget
allows; a worker whose check says "full" waits while trials are in flight, so the last trials
are finished (or retried) before any worker reports the study done.
"""

from __future__ import annotations

import os
import socket
import warnings
from contextlib import AbstractContextManager
from contextlib import nullcontext
from dataclasses import dataclass
from enum import Enum

import optuna
import sqlalchemy as sa
from optuna.storages._heartbeat import get_heartbeat_thread
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from tuner import records

# Trial user attribute: which worker ("host:pid") runs it. Only marked RUNNING trials count as in
# flight: an unmarked one was left by a run without heartbeats, or by a worker that died before
# its first heartbeat, and nothing would ever end it.
WORKER_KEY = "worker"


class Step(Enum):
    RUN = "run"    # start a trial now (under the claim lock)
    WAIT = "wait"  # the budget is taken by trials in flight; one may still fail or be rejected
    DONE = "done"  # the study holds n_trials measured trials


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(slots=True)
class Budget:
    target: int  # measured trials the study should hold
    study: optuna.Study
    storage: optuna.storages.RDBStorage  # the study's, unwrapped: reads RUNNING trials only
    engine: sa.Engine  # our records
    heartbeats: bool  # without them a dead worker's trial would look in flight forever
    _study_id: int | None = None

    def measured(self) -> int:
        return sum(recorded(self.engine, self.study.study_name).values())

    def step(self) -> Step:
        """Call under the claim lock; a RUN holds only until the trial is started and marked."""
        self.fail_stale()  # and re-queue them, before they are counted
        done = recorded(self.engine, self.study.study_name)
        measured = sum(done.values())
        if measured >= self.target:
            return Step.DONE
        in_flight = len(self.in_flight(done)) if self.heartbeats else 0
        return Step.RUN if measured + in_flight < self.target else Step.WAIT

    def heartbeat(self, number: int) -> AbstractContextManager:
        """Heartbeats for trial ``number`` while its work runs outside ``study.optimize``."""
        if not self.heartbeats:
            return nullcontext()
        return get_heartbeat_thread(self.trial_id(number), self.storage)

    def running(self, number: int) -> bool:
        """Whether trial ``number`` is still RUNNING (not failed as stale meanwhile)."""
        return self.storage.get_trial(self.trial_id(number)).state == TrialState.RUNNING

    def trial_id(self, number: int) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id(), number)

    def study_id(self) -> int:
        if self._study_id is None:
            self._study_id = self.storage.get_study_id_from_name(self.study.study_name)
        return self._study_id

    def fail_stale(self) -> None:
        """Fail the trials whose worker stopped sending heartbeats (the storage's stale-trial
        callback decides what follows). Call under the claim lock."""
        if self.heartbeats:
            _fail_stale_trials(self.study)

    def in_flight(self, done: dict[int, bool]) -> list[FrozenTrial]:
        """Marked RUNNING trials without a record in ``done`` (``recorded``)."""
        running = self.storage.get_all_trials(self.study_id(), deepcopy=False,
                                              states=(TrialState.RUNNING,))
        # A trial whose record is saved but whose Optuna state is not yet told is already counted.
        return [t for t in running if WORKER_KEY in t.user_attrs and t.number not in done]


class RetryUnrecorded:
    """Heartbeat-stale callback: re-queue the dead worker's configuration (same params, a new
    trial number) unless its record was saved before it died. That measurement stands, counts
    and is what ``best`` reads; measuring it again would record one configuration twice."""

    def __init__(self, engine: sa.Engine, study_name: str, max_retries: int) -> None:
        self._engine, self._study_name = engine, study_name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self._retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retries)

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.number in recorded(self._engine, self._study_name):
            return
        # The copy must not look in flight once popped, before its new worker's heartbeat.
        trial.user_attrs = {k: v for k, v in trial.user_attrs.items() if k != WORKER_KEY}
        self._retry(study, trial)


def recorded(engine: sa.Engine, study_name: str) -> dict[int, bool]:
    """Trial number -> measured, for every trial in our records."""
    t = records.trials
    query = sa.select(t.c.trial_number, t.c.measured).where(t.c.study == study_name)
    with engine.connect() as conn:
        return {number: bool(measured) for number, measured in conn.execute(query)}


def _fail_stale_trials(study: optuna.Study) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
