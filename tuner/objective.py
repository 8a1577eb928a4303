"""One trial: sample a configuration, measure it, score it, and record everything."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from backends import Backend
from backends import FailureClass
from backends import Measurement
from backends import Workload
from backends.flags import render_shell
from backends.launch_params import InvalidParams
from search_spaces import SearchSpace
from tuner import records
from tuner.interrupt import InterruptGate
from tuner.sla import Limit
from tuner.study import MEASURED_KEY

OBJECTIVES = ("output_tok_s@target", "tok_s_per_user@1")
FAILURE_KEY = "failure"


class TransientFailure(Exception):
    """A failure worth retrying: the trial is marked FAIL instead of teaching the sampler."""


@dataclass(slots=True)
class Objective:
    space: SearchSpace
    context: dict[str, Any]
    backend: Backend
    workload: Workload
    target_concurrency: int
    limits: Sequence[Limit]
    study_name: str
    engine: Any  # sqlalchemy Engine for our records
    gate: InterruptGate | None  # set by whoever runs the trials (Ctrl-C handling)

    def __call__(self, trial: optuna.Trial) -> tuple[float, float]:
        params = self.space.suggest(trial, self.context)
        problems = self.space.violations(params, self.context)
        with self.gate.measuring():
            rows = self._measure(params, problems)
        failure = next((m.failure for m in rows if m.failure), None)
        command, env = self._command(params)
        excerpt = next((m.log_excerpt for m in rows if m.log_excerpt), "")
        record = records.TrialRecord(
            trial_number=trial.number, backend=self.backend.name, params=params,
            status=failure.value if failure else "ok", measured=not problems, command=command,
            env=env, log_excerpt=excerpt, measurements={})
        # A rejected sample has no measurements to keep, only the reason in its log excerpt.
        records.save_trial(self.engine, self.study_name, record, [] if problems else rows)
        # Only now: an interrupted trial is neither recorded nor counted against the budget.
        trial.set_user_attr(MEASURED_KEY, not problems)
        if failure is not None and not failure.is_deterministic:  # transient, port in use
            raise TransientFailure(excerpt or f"{failure.value} failure")
        by_level = {m.concurrency: m for m in rows}
        self._constrain(trial, failure, by_level.get(self.target_concurrency))
        if failure:
            trial.set_user_attr(FAILURE_KEY, failure.value)
            return 0.0, 0.0
        return by_level[self.target_concurrency].output_tok_s, by_level[1].tok_s_per_user

    def _measure(self, params: dict[str, Any], problems: list[str]) -> list[Measurement]:
        if problems:  # never reaches a backend
            why = "violates " + "; ".join(problems)
            return [Measurement.failed(c, FailureClass.INVALID_CONFIG, why)
                    for c in self.workload.concurrency]
        return self.backend.measure(params, self.workload)

    def _command(self, params: dict[str, Any]) -> tuple[str, dict[str, str]]:
        try:
            return render_shell(self.backend.flags(params)), self.backend.env(params)
        except InvalidParams:
            return "", {}

    def _constrain(self, trial: optuna.Trial, failure: FailureClass | None,
                   at_target: Measurement | None) -> None:
        """Every trial sets the same keys; failed ones violate all of them."""
        trial.set_constraint(FAILURE_KEY, 1.0 if failure else 0.0)
        for limit in self.limits:
            observed = None if failure or at_target is None else getattr(at_target, limit.metric)
            trial.set_constraint(str(limit), limit.violation(observed))
