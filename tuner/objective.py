"""One trial: sample a configuration, measure it, score it, and record everything."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna

from backends import Backend, FailureClass, Measurement, Workload
from search_spaces import SearchSpace
from tuner.interrupt import InterruptGate
from tuner.params import parse
from tuner.recorder import Recorder
from tuner.sla import Limit
from tuner.study import MEASURED_KEY, VIOLATIONS_KEY

OBJECTIVES = ("output_tok_s@target", "tok_s_per_user@1")
FAILURE_KEY = "failure"
# Trial user attributes beside the objectives, for optuna-dashboard (the records hold all of it).
LATENCY_ATTRS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms")


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
    recorder: Recorder = field(init=False)
    _named: bool = field(default=False, init=False)  # the study's metric names are set

    def __post_init__(self) -> None:
        self.recorder = Recorder(self.backend, self.engine, self.study_name)

    def __call__(self, trial: optuna.Trial) -> tuple[float, float]:
        if not self._named:
            name_metrics(trial.study, OBJECTIVES)
            self._named = True
        params = self.space.suggest(trial, self.context)
        problems = self.space.violations(params, self.context)
        launch, invalid = parse(params)
        with self.gate.measuring():
            rows = self._measure(launch, problems, invalid)
        failure = next((m.failure for m in rows if m.failure), None)
        excerpt = next((m.log_excerpt for m in rows if m.log_excerpt), "")
        # A rejected sample (it breaks the space's constraints or does not parse) reached no
        # backend: no measurements to keep, only the reason in its log excerpt.
        rejected = bool(problems) or launch is None
        self.recorder.save(trial.number, params, launch, failure.value if failure else "ok",
                           not rejected, excerpt, [] if rejected else rows)
        # Only now: an interrupted trial is neither recorded nor counted against the budget.
        trial.set_user_attr(MEASURED_KEY, not rejected)
        if rejected:
            trial.set_user_attr(VIOLATIONS_KEY, problems or [invalid])
        if failure is not None and not failure.is_deterministic:  # transient, port in use
            raise TransientFailure(excerpt or f"{failure.value} failure")
        by_level = {m.concurrency: m for m in rows}
        self._constrain(trial, failure, by_level.get(self.target_concurrency))
        if failure:  # rejected samples too (invalid_config)
            trial.set_user_attr(FAILURE_KEY, failure.value)
            # PRUNED, not a 0-valued COMPLETE point: Optuna's TPE still ranks it as infeasible
            # by its violated constraints and samples away from it; a FAIL trial it ignores.
            raise optuna.TrialPruned(failure.value)
        at_target = by_level[self.target_concurrency]
        for name in LATENCY_ATTRS:
            if getattr(at_target, name) is not None:
                trial.set_user_attr(f"{name}@target", getattr(at_target, name))
        return at_target.output_tok_s, by_level[1].tok_s_per_user

    def _measure(self, launch, problems: list[str], invalid: str) -> list[Measurement]:
        if problems or launch is None:  # never reaches a backend
            why = "violates " + "; ".join(problems) if problems else invalid
            return [Measurement.failed(c, FailureClass.INVALID_CONFIG, why)
                    for c in self.workload.concurrency]
        return self.backend.measure(launch, self.workload)

    def _constrain(self, trial: optuna.Trial, failure: FailureClass | None,
                   at_target: Measurement | None) -> None:
        """Every trial sets the same keys; failed ones violate all of them."""
        trial.set_constraint(FAILURE_KEY, 1.0 if failure else 0.0)
        for limit in self.limits:
            observed = None if failure or at_target is None else getattr(at_target, limit.metric)
            trial.set_constraint(str(limit), limit.constraint(observed))


def name_metrics(study: optuna.Study, names: Sequence[str]) -> None:
    """What optuna-dashboard calls the two objectives (set once per study)."""
    if study.metric_names != list(names):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(list(names))
