"""One launch-aware worker: under the study's claim lock it reads every launch the study holds
and those in flight, asks the strategy what next and claims it; it launches with a heartbeat,
then records the launch under the lock unless it was failed as stale meanwhile. Any number of
workers run this loop on one study (docs/SCALE_OUT.md); a single worker is the same loop."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import optuna

from tuner import records
from tuner import render
from tuner.budget import recorded
from tuner.claim import WAIT_POLL_S
from tuner.claim import Claim
from tuner.launches.gates import Gates
from tuner.launches.launcher import Launch
from tuner.launches.launcher import Launcher
from tuner.launches.strategy import PROBE_REFERENCE
from tuner.launches.strategy import Claimed
from tuner.launches.strategy import Decision
from tuner.launches.strategy import Done
from tuner.launches.strategy import LaunchAware
from tuner.launches.strategy import Outcome
from tuner.launches.strategy import Plan
from tuner.study import MEASURED_KEY

# Trial user attributes: the launch runs the gates (the others wait rather than gate twice);
# the launch is the baseline, whose outputs the gates judge by.
GATED_KEY = "gated"
REFERENCE_KEY = "reference"
# Study user attribute: the winner's configuration key, once a worker decided it, and the
# settings it was decided under. Workers refit alike from the same launches, but each on its
# own machine and install, where floating point may part a near tie; the first decision stands
# for every worker with the same SLA and tuning settings (a study resumed with others decides
# again).
WINNER_KEY = "winner"

Tally = Callable[[list[Launch], int], None]  # the study's launches, and how many in flight


@dataclass
class LaunchWorker:
    strategy: LaunchAware
    launcher: Launcher
    gates: Gates
    claim: Claim
    on_progress: Tally = lambda done, flying: None

    def run(self) -> Outcome:
        """Launch until the study is decided; every worker on it returns the same winner."""
        return self._outcome(self._loop().winner)

    def _loop(self) -> Done:
        told = False
        while True:
            with self.claim.lock:
                decision = self._decide()
                claimed = self._claim(decision) if isinstance(decision, Plan) else None
            if claimed is not None:
                self._launch(decision, *claimed)
            elif isinstance(decision, Done):
                return decision
            else:
                if not told:
                    render.note("waiting for launches in flight on other workers (or, if their "
                                "worker died, for them to go stale)")
                    told = True
                time.sleep(WAIT_POLL_S)

    def _decide(self) -> Decision:
        """The strategy's decision from the study as it stands (call under the lock)."""
        done, flying = self._study_launches()
        self.launcher.launches = done
        self.on_progress(done, len(flying))
        study, settings = self.launcher.study, self._settings()
        decided = study.user_attrs.get(WINNER_KEY) or {}
        if decided.get("settings") == settings:
            return Done(next((x for x in reversed(done) if x.key == decided["key"]
                              and x.excerpt == records.GATES_PASSED), None))
        decision = self.strategy.next_launch(done, flying)
        if isinstance(decision, Done) and decision.winner is not None:
            study.set_user_attr(WINNER_KEY, {"key": decision.winner.key, "settings": settings})
        return decision

    def _settings(self) -> str:
        """What a ranking depends on besides the launches: the SLA and the tuning settings."""
        text = json.dumps([repr(self.launcher.limits),
                           self.strategy.tuning.model_dump(mode="json")], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _study_launches(self) -> tuple[list[Launch], list[Claimed]]:
        """Every launch the study recorded, and those in flight (a dead worker's failed first)."""
        budget = self.claim.budget
        budget.fail_stale()  # a dead worker's launch leaves the in-flight count: re-planned
        numbers = recorded(budget.engine, self.launcher.study_name)
        measured = [t for t in records.load_trials(budget.engine, self.launcher.study_name)
                    if t.measured]
        reference = self._reference_trial(measured)
        done = [Launch.from_record(t, self.launcher.limits, t.trial_number == reference)
                for t in measured]
        flying = [Claimed(t.params, t.user_attrs.get(GATED_KEY, False),
                          t.user_attrs.get(REFERENCE_KEY, False))
                  for t in budget.in_flight(numbers)] if budget.heartbeats else []
        return done, flying

    def _reference_trial(self, measured: list[records.TrialRecord]) -> int | None:
        """The baseline's trial number: the trial marked as the reference, or in a study whose
        launches carry no marks, its first launch (nothing else started before it then)."""
        trials = self.launcher.study.get_trials(deepcopy=False)
        marked = [t.number for t in trials if t.user_attrs.get(REFERENCE_KEY)]
        if marked:
            return marked[-1]
        return measured[0].trial_number if measured else None

    def _claim(self, plan: Plan) -> tuple[optuna.Trial, dict]:
        def mark(trial: optuna.Trial) -> None:
            for key, on in ((GATED_KEY, plan.gated), (REFERENCE_KEY, plan.reference)):
                if on:
                    trial.set_user_attr(key, True)
            self.claim.mark(trial)

        return self.launcher.claim(plan.params, mark)

    def _launch(self, plan: Plan, trial: optuna.Trial, params: dict) -> None:
        study, budget = self.launcher.study, self.claim.budget
        if plan.gated and self.gates.reference is None:  # the baseline ran on another worker
            self.gates.reference = study.user_attrs.get(PROBE_REFERENCE)
        with budget.heartbeat(trial.number):
            result = self.launcher.launch(
                trial, params, plan.guess, plan.bar, self.gates if plan.gated else None,
                self.gates.record_reference if plan.reference else None)
        with self.claim.lock:
            if not budget.running(trial.number):
                render.note(f"launch {trial.number} went stale while it ran (this worker "
                            "stalled) and was planned again; its result is dropped", "yellow")
                return
            if plan.reference:  # kept in the study: every worker judges by the same outputs
                study.set_user_attr(PROBE_REFERENCE, self.gates.reference)
            self.launcher.record(trial, result)

    def _outcome(self, winner: Launch | None) -> Outcome:
        done = self.launcher.launches
        clocks = [t.user_attrs for t in self.launcher.study.get_trials(deepcopy=False)
                  if t.user_attrs.get(MEASURED_KEY)]
        return Outcome(winner, winner and sum(x.key == winner.key for x in done), len(done),
                       sum(c.get("launch_s", 0.0) for c in clocks),
                       sum(c.get("measure_s", 0.0) for c in clocks))
