"""The launch-aware strategy: explore where the calibrated model points, then make finalists
prove themselves in fresh launches.

It is a decision over the study's history: given every launch the study holds (whichever worker
measured it) and the launches in flight, ``next_launch`` says what to launch next, to wait, or
that the study is done. One worker asks it in a loop; several workers ask it in turn, under the
study's claim lock (``tuner.launches.worker``).

1. The baseline (no speculation) is launched first: it is every comparison's reference, and
   its greedy outputs define lossless. Other workers explore from the uncalibrated model
   while it runs; that round is dropped once the baseline lands.
2. Exploration rounds: refit the model to everything measured, propose its ``per_round`` best
   configurations not yet launched or in flight, launch them one by one; when a round's
   proposals are all taken, refit and propose again. Each launch finds its own SLA limit with
   short windows; a limit that beats the best score so far is measured again with a long window.
3. The knobs the model cannot price (MEASURED_ONLY: the all-reduce path, NCCL's protocol, ...)
   are measured instead: knob by knob, in the space's order, the leader so far is launched
   with each other value of that knob, so a value that wins leads into the next knob.
4. Successive halving: the best ``finalists`` (by median minus spread penalty) are relaunched,
   the better half again, until the leader has ``repeats`` runs. A run in flight counts as owed
   runs paid, so finalists' relaunches spread over workers.
5. The leader's last launch runs the gates, once none of its own runs is in flight (other
   finalists' may be: should one of them overtake it, the new leader is gated in turn); a
   failure disqualifies it and the next leader goes through the same.
The launch budget counts every launch, gates and repeats included, and launches in flight.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections import defaultdict
from dataclasses import dataclass
from dataclasses import field

from tuner import stats
from tuner.config import TuningConfig
from tuner.finals import owed_runs
from tuner.records import GATES_PASSED
from tuner.launches.launcher import Launch
from tuner.launches.screen import Screen
from tuner.selection import config_key

BASELINE = {"speculative_algorithm": "none"}
PROBE_REFERENCE = "probe_reference"
# The model is never trusted beyond this relative error: its residuals are estimated from a
# few dozen noisy runs, and an exact-looking fit is still only a model.
MODEL_ERROR_FLOOR = 0.02  # study user attribute: the baseline's greedy outputs


@dataclass(slots=True)
class Outcome:
    winner: Launch | None  # the configuration that passed everything (its latest launch)
    runs: int  # its launches
    launches: int
    launch_s: float
    measure_s: float


@dataclass(slots=True)
class Plan:
    """The next launch: what to launch and how."""

    params: dict
    guess: int | None = None  # where its SLA search starts
    bar: float | None = None  # a short-window limit below it gets no long window
    gated: bool = False  # the leader's gated launch
    reference: bool = False  # the baseline: its outputs are what lossless means


@dataclass(slots=True)
class Claimed:
    """A launch in flight on some worker."""

    params: dict
    gated: bool = False
    reference: bool = False

    @property
    def key(self) -> str:
        return config_key(self.params)


@dataclass(slots=True)
class Done:
    winner: Launch | None


WAIT = "wait"  # the next decision needs a launch in flight to finish

Decision = Plan | Done | str


@dataclass
class LaunchAware:
    screen: Screen
    tuning: TuningConfig
    done: list[Launch] = field(default_factory=list)  # the study's launches, in trial order
    flying: list[Claimed] = field(default_factory=list)
    _round: list = field(default_factory=list)  # this round's proposals
    _round_calibrated: bool = False  # proposed after the baseline was measured
    _no_baseline: bool = False  # the screen had no configuration without speculation to propose
    _fitted_on: int = -1  # launches the screen was last calibrated on

    def next_launch(self, done: list[Launch], flying: list[Claimed]) -> Decision:
        """What to do next, from the study's launches and those in flight."""
        self.done, self.flying = done, flying
        return (self._baseline() or self._explore() or self._measure_unpriced()
                or self._finals())

    # --- budget -----------------------------------------------------------------------------

    @property
    def left(self) -> int:
        return self.tuning.launches - len(self.done) - len(self.flying)

    def _finals_budget(self) -> int:
        """Launches the finals need when every finalist has run once (the leader's last run is
        its gated one), plus one per finalist: re-measurement reorders finalists, and a
        newcomer to the top owes runs of its own."""
        t = self.tuning
        return sum(self._needed(rank) - 1 for rank in range(t.finalists)) + t.finalists

    def _unpriced_budget(self) -> int:
        """Launches kept for the unpriced knobs: one per other value of each, as counted on the
        baseline, at most half of what exploration would otherwise have."""
        base = next((x.params for x in [*self.done, *self.flying] if x.reference), None)
        if base is None:
            return 0
        wanted = sum(len(self.screen.variants(base, knob)) for knob in self._unpriced())
        return min(wanted, (self.tuning.launches - self._finals_budget() - 1) // 2)

    def _unpriced(self) -> list[str]:
        """The unpriced knobs the space samples, in its order."""
        return [n for n in self.screen.space.param_names if n in self.screen.unpriced]

    def _needed(self, rank: int) -> int:
        """Runs the finalist at ``rank`` needs (successive halving, ``owed_runs``); the leader
        always gets a gated run beyond its first."""
        runs = owed_runs(rank, self.tuning.finalists, self.tuning.repeats)
        return max(runs, 2) if rank == 0 else runs

    # --- phases -----------------------------------------------------------------------------

    def _baseline(self) -> Decision | None:
        if (self._no_baseline or self.left <= 0
                or any(x.reference for x in [*self.done, *self.flying])):
            return None
        base = self.screen.propose(1, set(), must=BASELINE)
        self._no_baseline = not base
        return Plan(base[0].params, base[0].limit, reference=True) if base else None

    def _reference_measured(self) -> bool:
        return any(x.reference for x in self.done)

    def _explore(self) -> Decision | None:
        reserved = self._finals_budget() + self._unpriced_budget()
        if self.left <= reserved:
            return None
        taken = {self.screen.priced_key(p) for p in self._claimed_params()}
        if self._reference_measured() and not self._round_calibrated:
            self._round = []  # proposed by the uncalibrated model while the baseline ran
        fresh = [p for p in self._round if self.screen.priced_key(p.params) not in taken]
        if not fresh:
            self._refit()
            self._round_calibrated = self._reference_measured() or self._no_baseline
            fresh = self._round = self.screen.propose(
                min(self.tuning.per_round, self.left - reserved), taken)
        if not fresh:
            return None
        return Plan(fresh[0].params, fresh[0].limit, bar=self._bar())

    def _measure_unpriced(self) -> Decision | None:
        if self.left <= self._finals_budget():
            return None
        self._refit()
        ranked = self._ranked()
        if not ranked:
            return None
        leader = self._runs()[ranked[0]][-1]
        guess = leader.best.concurrency if leader.best else None
        taken = {config_key(p) for p in self._claimed_params()}
        for knob in self._unpriced():
            for variant in self.screen.variants(leader.params, knob):
                if config_key(variant) not in taken:
                    return Plan(variant, guess, bar=self._bar())
        return None

    def _finals(self) -> Decision:
        self._refit()
        # The study remembers which configurations already went through the gates.
        passed = {x.key: x for x in self.done if x.excerpt == GATES_PASSED}
        disqualified = {x.key for x in self.done if x.verdict}
        ranked = [k for k in self._ranked() if k not in disqualified]
        if not ranked or (ranked[0] in passed) or self.left <= 0:
            # Decided once nothing is in flight: a launch still running may reorder the leaders.
            return WAIT if self.flying else Done(next((passed[k] for k in ranked if k in passed),
                                                      None))
        pool = ranked[:self.tuning.finalists]
        runs = Counter(c.key for c in self.flying) + Counter(x.key for x in self.done)
        owing = [k for rank, k in enumerate(pool)
                 if runs[k] < self._needed(rank) - (rank == 0)]
        # The best-ranked finalist owing runs goes first; the last launch always gates the
        # leader, however re-measurement reshuffled the finalists.
        if owing and self.left > 1:
            return self._relaunch(owing[0])
        # One gated launch at a time, of a leader none of whose runs is still moving its score,
        # judged against the baseline's outputs.
        if any(c.gated or c.reference or c.key == pool[0] for c in self.flying):
            return WAIT
        return self._relaunch(pool[0], gated=True)

    # --- helpers ----------------------------------------------------------------------------

    def _refit(self) -> None:
        """Calibrate the screen on every launch measured, unless it already is."""
        if self._fitted_on != len(self.done):
            self.screen.calibrate(self._observations())
            self._fitted_on = len(self.done)

    def _claimed_params(self) -> list[dict]:
        return [x.params for x in self.done] + [c.params for c in self.flying]

    def _relaunch(self, key: str, gated: bool = False) -> Plan:
        last = self._runs()[key][-1]
        guess = last.best.concurrency if last.best else None
        return Plan(last.params, guess, gated=gated)

    def _runs(self) -> dict[str, list[Launch]]:
        runs: dict[str, list[Launch]] = defaultdict(list)
        for x in self.done:
            runs[x.key].append(x)
        return runs

    def _scores(self) -> dict[str, float]:
        """Configurations whose every run succeeded, scored by a lower bound that weighs their
        runs against the calibrated model's prediction (see stats.blended_score)."""
        t = self.tuning
        runs = {k: [x.value for x in xs] for k, xs in self._runs().items()
                if all(x.value is not None for x in xs)}
        params = {x.key: x.params for x in self.done}
        predicted = {k: self.screen.predict(params[k]) for k in runs}
        noise = stats.pairwise_noise(runs.values(), t.noise_prior)
        model = self._model_error(runs, predicted, noise)
        return {k: stats.blended_score(v, predicted[k] and predicted[k].goodput, model, noise,
                                       t.mad_penalty) for k, v in runs.items()}

    @staticmethod
    def _model_error(runs, predicted, noise: float) -> float:
        """Relative SD of the model's error: what its residuals show beyond the noise."""
        logs = [math.log(v / predicted[k].goodput) for k, vs in runs.items() for v in vs
                if predicted[k] and predicted[k].goodput > 0 and v > 0]
        if len(logs) < 4:
            return 1.0  # too few to judge the model: trust the runs
        excess = statistics.pvariance(logs) - noise ** 2
        return math.sqrt(max(excess, 0.0) + MODEL_ERROR_FLOOR ** 2)

    def _ranked(self) -> list[str]:
        scores = self._scores()
        return sorted(scores, key=lambda k: -scores[k])

    def _bar(self) -> float | None:
        """A short-window limit below the best score so far is not worth a long window."""
        scores = self._scores()
        return max(scores.values()) if scores else None

    def _observations(self):
        return [(x.params, m) for x in self.done for m in x.points if m.ok]
