"""The launch-aware strategy: explore where the calibrated model points, then make finalists
prove themselves in fresh launches.

1. The baseline (no speculation) is launched first: it is every comparison's reference, and
   its greedy outputs define lossless.
2. Exploration rounds: refit the model to everything measured, launch its ``per_round`` best
   configurations not yet launched. Each launch finds its own SLA limit with short windows; a
   limit that beats the best score so far is measured again with a long window.
3. The knobs the model cannot price (MEASURED_ONLY: the all-reduce path, NCCL's protocol, ...)
   are measured instead: knob by knob, in the space's order, the leader so far is launched
   with each other value of that knob, so a value that wins leads into the next knob.
4. Successive halving: the best ``finalists`` (by median minus spread penalty) are relaunched,
   the better half again, until the leader has ``repeats`` runs.
5. The leader's last launch runs the gates; a failure disqualifies it and the next leader goes
   through the same.
The launch budget counts every launch, gates and repeats included.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from tuner import stats
from tuner.config import TuningConfig
from tuner.finals import owed_runs
from tuner.launches.gates import Gates
from tuner.records import GATES_PASSED
from tuner.launches.launcher import Launch
from tuner.launches.launcher import Launcher
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


@dataclass
class LaunchAware:
    launcher: Launcher
    screen: Screen
    gates: Gates
    tuning: TuningConfig
    on_launch: Callable[[Launch], None] = lambda launch: None

    def run(self) -> Outcome:
        self._explore()
        self._measure_unpriced()
        winner = self._finals()
        history = self.launcher.launches
        return Outcome(winner, winner and len(self._runs()[winner.key]),
                       len(history), sum(x.clock.launch_s for x in history),
                       sum(x.clock.measure_s for x in history))

    # --- budget -----------------------------------------------------------------------------

    @property
    def left(self) -> int:
        return self.tuning.launches - len(self.launcher.launches)

    def _finals_budget(self) -> int:
        """Launches the finals need when every finalist has run once (the leader's last run is
        its gated one), plus one per finalist: re-measurement reorders finalists, and a
        newcomer to the top owes runs of its own."""
        t = self.tuning
        return sum(self._needed(rank) - 1 for rank in range(t.finalists)) + t.finalists

    def _unpriced_budget(self) -> int:
        """Launches kept for the unpriced knobs: one per other value of each, as counted on the
        baseline, at most half of what exploration would otherwise have."""
        base = next(iter(self.launcher.launches), None)
        if base is None:
            return 0
        wanted = sum(len(self.screen.variants(base.params, knob)) for knob in self._unpriced())
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

    def _explore(self) -> None:
        if not self.launcher.launches:
            base = self.screen.propose(1, set(), must=BASELINE)
            if base:
                self._launch(base[0].params, base[0].limit,
                             reference=self.gates.record_reference)
                # Kept in the study, so a resumed run judges against the same outputs.
                self.launcher.study.set_user_attr(PROBE_REFERENCE, self.gates.reference)
        reserved = self._finals_budget() + self._unpriced_budget()
        while self.left > reserved:
            self.screen.calibrate(self._observations())
            launched = {self.screen.priced_key(x.params) for x in self.launcher.launches}
            room = self.left - reserved
            proposals = self.screen.propose(min(self.tuning.per_round, room), launched)
            if not proposals:
                break
            for p in proposals:
                self._launch(p.params, p.limit, bar=self._bar())

    def _measure_unpriced(self) -> None:
        for knob in self._unpriced():
            ranked = self._ranked()
            if not ranked:
                return
            leader = self._runs()[ranked[0]][-1]
            guess = leader.best.concurrency if leader.best else None
            for variant in self.screen.variants(leader.params, knob):
                if self.left <= self._finals_budget():
                    return
                if config_key(variant) not in self._runs():
                    self._launch(variant, guess, bar=self._bar())

    def _finals(self) -> Launch | None:
        # A resumed study remembers which configurations already went through the gates.
        passed = {x.key: x for x in self.launcher.launches if x.excerpt == GATES_PASSED}
        disqualified = {x.key for x in self.launcher.launches if x.verdict}
        while True:
            self.screen.calibrate(self._observations())
            ranked = [k for k in self._ranked() if k not in disqualified]
            if not ranked:
                return None
            pool = ranked[:self.tuning.finalists]
            if pool[0] in passed:
                return passed[pool[0]]
            if self.left <= 0:  # out of launches: the best that passed, if any did
                return next((passed[k] for k in ranked if k in passed), None)
            owing = [k for rank, k in enumerate(pool)
                     if len(self._runs()[k]) < self._needed(rank) - (rank == 0)]
            # The best-ranked finalist owing runs goes first; the last launch always gates the
            # leader, however re-measurement reshuffled the finalists.
            if owing and self.left > 1:
                self._relaunch(owing[0])
                continue
            leader = self._relaunch(pool[0], gated=True)
            if leader.verdict or leader.failure:
                disqualified.add(leader.key)
            else:
                passed[leader.key] = leader

    # --- helpers ----------------------------------------------------------------------------

    def _launch(self, params: dict, guess: int | None, bar: float | None = None,
                gates=None, reference=None) -> Launch:
        result = self.launcher.launch(params, guess, bar, gates, reference)
        self.on_launch(result)
        return result

    def _relaunch(self, key: str, gated: bool = False) -> Launch:
        last = self._runs()[key][-1]
        guess = last.best.concurrency if last.best else None
        return self._launch(last.params, guess, gates=self.gates if gated else None)

    def _runs(self) -> dict[str, list[Launch]]:
        runs: dict[str, list[Launch]] = defaultdict(list)
        for x in self.launcher.launches:
            runs[x.key].append(x)
        return runs

    def _scores(self) -> dict[str, float]:
        """Configurations whose every run succeeded, scored by a lower bound that weighs their
        runs against the calibrated model's prediction (see stats.blended_score)."""
        t = self.tuning
        runs = {k: [x.value for x in xs] for k, xs in self._runs().items()
                if all(x.value is not None for x in xs)}
        params = {x.key: x.params for x in self.launcher.launches}
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
        return [(x.params, m) for x in self.launcher.launches for m in x.points if m.ok]
