"""One worker's turn to start a trial: count, start and mark it while holding the claim lock."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import optuna

from tuner import render
from tuner.budget import WORKER_KEY
from tuner.budget import Budget
from tuner.budget import Step
from tuner.budget import worker_name
from tuner.claim_lock import ClaimLock

# A waiting worker re-reads the study this often: two small queries, cheap even for many workers.
WAIT_POLL_S = 1.0


@dataclass(slots=True)
class Claim:
    budget: Budget
    lock: ClaimLock
    worker: str = field(default_factory=worker_name)

    def wait_turn(self, stop: Callable[[], bool]) -> bool:
        """True with the lock held when this worker may start a trial; False when the study is
        done (or ``stop`` asks to end). Waits while the budget is taken by trials in flight."""
        told = False
        while not stop():
            self.lock.acquire()
            step = self.budget.step()
            if step is Step.RUN:
                return True
            self.lock.release()
            if step is Step.DONE:
                return False
            if not told:
                render.note("the rest of the budget is running on other workers; waiting until "
                            "those trials finish (or, if their worker died, are retried)")
                told = True
            time.sleep(WAIT_POLL_S)
        return False

    def marking(self, objective: Callable[[optuna.Trial], Any]) -> Callable[[optuna.Trial], Any]:
        """``objective`` run as this worker's claimed trial; the lock is released once the trial
        (created by Optuna's ask, inside ``study.optimize``) is marked as in flight."""

        def claimed(trial: optuna.Trial) -> Any:
            self.mark(trial)
            self.lock.release()
            return objective(trial)

        return claimed

    def mark(self, trial: optuna.Trial) -> None:
        """Mark ``trial`` as this worker's, in flight (under the lock)."""
        if self.budget.heartbeats:
            # The mark needs a heartbeat first: a marked trial with none would never go
            # stale, so if this worker died right here the others would wait forever.
            self.budget.storage.record_heartbeat(self.budget.trial_id(trial.number))
        trial.set_user_attr(WORKER_KEY, self.worker)
