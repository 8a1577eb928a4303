"""One launch, start to finish: bring the configuration up, find its SLA limit with short
windows, measure the limit again with a long window when it could matter, run the gates when
asked, and record it all as one trial (Optuna's and ours)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import optuna

from backends import Backend, FailureClass, LaunchParams, Measurement, Workload
from backends.contract import LaunchFailed
from backends.session import Clock, Session
from search_spaces import SearchSpace
from tuner import records
from tuner.launches.sla_search import search_limit
from tuner.params import parse
from tuner.recorder import Recorder
from tuner.selection import config_key
from tuner.sla import Limit, meets
from tuner.study import MEASURED_KEY

_FIELDS = {f.name for f in fields(Measurement)} - {"failure", "concurrency"}
# What a launch tells Optuna: throughput at its own SLA limit, and per user at concurrency 1.
LAUNCH_OBJECTIVES = ("output_tok_s@sla_limit", "tok_s_per_user@1")
# Long windows at a launch's limit: the first at the short windows' limit, the rest each a step
# lower while the long window misses the SLA there.
LONG_WINDOW_TRIES = 3
MIN_STEP_DOWN = 0.05
# Trial status of a configuration that ran but failed an integrity gate: never chosen.
DISQUALIFIED = "disqualified"

Gate = Callable[[Session, LaunchParams, Measurement], "str | None"]  # why it failed, or None


@dataclass(slots=True)
class Launch:
    """What one launch found."""

    params: dict[str, Any]
    points: list[Measurement]  # one per level measured (the last window at that level)
    best: Measurement | None  # highest-throughput level within the SLA
    per_user: float | None  # tok/s per user at concurrency 1
    clock: Clock = field(default_factory=Clock)
    failure: FailureClass | None = None
    verdict: str | None = None  # why a gate disqualified it
    excerpt: str = ""
    launch: LaunchParams | None = None  # None: the parameters did not parse
    reference: bool = False  # the baseline: its outputs are what lossless means

    @property
    def key(self) -> str:
        return config_key(self.params)

    @classmethod
    def from_record(cls, t: records.TrialRecord, limits: list[Limit], reference: bool = False
                    ) -> Launch:
        """A launch recorded in the study (by any worker, or an earlier run)."""
        rows = [Measurement(concurrency=c, failure=row["failure"] and FailureClass(row["failure"]),
                            **{k: v for k, v in row.items() if k in _FIELDS})
                for c, row in t.measurements.items()]
        best = max((m for m in rows if meets(m, limits)), default=None,
                   key=lambda m: m.output_tok_s)
        one = t.measurements.get(1)
        failure = None if t.status in ("ok", DISQUALIFIED) else FailureClass(t.status)
        return cls(t.params, rows, best, one and one["tok_s_per_user"], failure=failure,
                   verdict=t.log_excerpt if t.status == DISQUALIFIED else None,
                   excerpt=t.log_excerpt, launch=t.launch, reference=reference)

    @property
    def value(self) -> float | None:
        return self.best.output_tok_s if self.best is not None and not self.verdict else None


@dataclass
class Launcher:
    study: optuna.Study
    space: SearchSpace
    context: dict[str, Any]
    backend: Backend
    workload: Workload
    limits: list[Limit]
    engine: Any  # sqlalchemy Engine of our records
    study_name: str
    max_concurrency: int
    long_factor: float = 4.0
    launches: list[Launch] = field(default_factory=list)  # the study's, all workers'
    recorder: Recorder = field(init=False)

    def __post_init__(self) -> None:
        self.recorder = Recorder(self.backend, self.engine, self.study_name)

    def claim(self, params: dict[str, Any], mark: Callable[[optuna.Trial], None]
              ) -> tuple[optuna.Trial, dict[str, Any]]:
        """Start the trial of ``params`` and ``mark`` it as in flight (under the claim lock)."""
        self.study.enqueue_trial(params)
        with warnings.catch_warnings():
            # Launch-aware workers start their trials' heartbeats themselves (worker.py), not
            # through Optuna's optimize, so its warning about asking with heartbeats on does
            # not apply.
            warnings.simplefilter("ignore", UserWarning)
            trial = self.study.ask()
        params = self.space.suggest(trial, self.context)
        mark(trial)
        return trial, params

    def launch(self, trial: optuna.Trial, params: dict[str, Any], guess: int | None = None,
               bar: float | None = None, gates: Gate | None = None,
               reference: Callable[[Session], None] | None = None) -> Launch:
        """Launch ``params``; a limit whose short-window throughput is below ``bar`` is not
        measured again (the cheap fidelity pruned it). ``gates`` judge the launch;
        ``reference`` records what later launches are judged against (the baseline's outputs)."""
        try:
            return self.find(params, guess, bar, gates, reference)
        except BaseException:  # Ctrl-C mid-launch: the server is gone, the trial did not count
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise

    def find(self, params, guess, bar, gates, reference) -> Launch:
        """What a launch of ``params`` finds, unrecorded (``launch`` has the arguments)."""
        launch, invalid = parse(params)
        try:
            if launch is None:
                raise LaunchFailed(FailureClass.INVALID_CONFIG, invalid)
            with self.backend.session(launch, self.workload) as session:
                if reference is not None:
                    reference(session)
                found = self._measure(session, params, launch, guess, bar, gates)
        except LaunchFailed as error:
            found = Launch(params, [], None, None, failure=error.failure,
                           excerpt=error.log_excerpt, launch=launch)
        found.reference = reference is not None
        return found

    def _measure(self, session: Session, params, launch, guess, bar, gates) -> Launch:
        found = search_limit(session.measure, self.limits, self.max_concurrency, guess)
        points = found.points
        if found.best is not None and (bar is None or found.best.output_tok_s >= bar):
            c = found.best.concurrency
            for _ in range(LONG_WINDOW_TRIES):
                long = session.measure(c, round(self.long_factor * max(2 * c, 8)))
                points.append(long)
                if not long.ok or c == 1 or meets(long, self.limits):
                    break
                # The long window says the limit is lower than the short one did. Without a
                # level under it that meets the SLA the launch would be worth its next-best
                # measured level, often concurrency 1 (1/20 of its throughput), for missing
                # TPOT by 0.3%.
                c = _step_down(long, self.limits)
        rows = _last_per_level(points)
        best = max((m for m in rows if meets(m, self.limits)), default=None,
                   key=lambda m: m.output_tok_s)
        failed = next((m for m in points if not m.ok), None)
        gated = gates is not None and best is not None and not failed
        verdict = gates(session, launch, best) if gated else None
        one = next((m for m in points if m.concurrency == 1 and m.ok), None)
        return Launch(params, rows, best, one and one.tok_s_per_user, session.clock,
                      failed.failure if failed else None, verdict,
                      failed.log_excerpt if failed else verdict or (records.GATES_PASSED
                                                                    if gated else ""), launch)

    def record(self, trial: optuna.Trial, result: Launch) -> None:
        """Save ``result`` as ``trial``'s record and tell Optuna."""
        status = (result.failure.value if result.failure
                  else DISQUALIFIED if result.verdict else "ok")
        self.recorder.save(
            trial.number, result.params, result.launch, status, True, result.excerpt,
            result.points)
        trial.set_user_attr(MEASURED_KEY, True)
        trial.set_user_attr("launch_s", result.clock.launch_s)
        trial.set_user_attr("measure_s", result.clock.measure_s)
        if result.value is None:
            trial.set_user_attr("failure", status)
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(trial, [result.value, result.per_user or 0.0])


def _step_down(m: Measurement, limits: list[Limit]) -> int:
    """A level below ``m``'s by the largest relative miss of its limits (at least 5%)."""
    misses = [limit.violation(getattr(m, limit.metric)) / abs(limit.value) for limit in limits
              if limit.value and getattr(m, limit.metric) is not None]
    miss = max([MIN_STEP_DOWN, *misses])
    return max(1, min(m.concurrency - 1, int(m.concurrency / (1 + miss))))


def _last_per_level(points: list[Measurement]) -> list[Measurement]:
    """The record keeps one row per level: the last (the long window, where there was one)."""
    return list({m.concurrency: m for m in points}.values())
