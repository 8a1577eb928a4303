"""From today's repeats to verdicts: each configuration against its history, and each
challenger against the incumbent measured tonight."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import sqlalchemy as sa

from tuner.config import Config
from tuner.errors import UsageError
from tuner.nightly.compare import Reference
from tuner.nightly.compare import Verdict
from tuner.nightly.compare import beats
from tuner.nightly.compare import judge
from tuner.nightly.compare import reference_from_runs
from tuner.nightly.measure import ProbeResult
from tuner.nightly.plan import BASELINE_ROLE
from tuner.nightly.plan import config_key
from tuner.records import TrialRecord
from tuner.records import nightly
from tuner.stats import mad
from tuner.stats import median
from tuner.stats import relative_noise

# (column in the nightly repeats table, concurrency level, metric in the study's records)
THROUGHPUT = ("output_tok_s", None, "output_tok_s")  # None: the target concurrency
PER_USER = ("tok_s_per_user", 1, "tok_s_per_user")


@dataclass(slots=True, frozen=True)
class Settings:
    repeats: int = 5
    explore: int = 2
    threshold: float = 0.05
    mad_k: float = 3.0
    history: int = 5
    rebase: bool = False

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.explore < 0 or self.history < 1:
            raise UsageError("repeats and history must be >= 1, explore >= 0")
        if not 0.0 <= self.threshold < 1.0 or self.mad_k < 0:
            raise UsageError("threshold must be in [0, 1) and mad_k >= 0")

    @property
    def min_ok(self) -> int:
        """Successful incumbent repeats needed for a verdict: a majority."""
        return (self.repeats + 1) // 2


@dataclass(slots=True)
class Findings:
    results: list[ProbeResult]  # incumbent first
    target: int
    verdict: Verdict | None  # the incumbent's throughput against its history; decides exit 1
    per_user: Verdict | None  # the incumbent at concurrency 1 against its history (reported)
    baseline: Verdict | None  # the baseline against its own history (reported)
    challengers: list[tuple[ProbeResult, Verdict]]  # each against the incumbent today
    winner: tuple[ProbeResult, Verdict] | None  # the best challenger beyond noise, within SLA
    rebased: bool
    winner_command: str | None = None
    env_changes: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return bool(self.verdict and self.verdict.regressed)

    def numbers(self) -> dict[str, Any]:
        """The run row's columns about the incumbent."""
        inc, v = self.results[0], self.verdict
        # An incumbent without speculation is its own baseline.
        base = next((r for r in self.results if r.probe.role == BASELINE_ROLE and r.values),
                    None if inc.probe.launch.speculative else inc)
        return {"median": median(inc.values), "mad": mad(inc.values), "n_repeats": len(inc.values),
                "baseline_median": median(base.values) if base else None,
                "reference_median": v.reference.median if v else None,
                "tolerance": v.tolerance if v else None}


def findings_of(results: list[ProbeResult], db: sa.Engine, study: str,
                trials: Sequence[TrialRecord], run_cfg: Config, s: Settings) -> Findings:
    target = run_cfg.workload.target_concurrency
    inc = results[0]
    noise = relative_noise([r.values for r in results])

    def against_history(r: ProbeResult, values: list[float], metric: tuple,
                        noise: float) -> Verdict | None:
        ref = _reference(db, study, trials, r.probe.key, metric, target, s.history)
        return judge(values, ref, noise, s.threshold, s.mad_k) if ref and values else None

    base = next((r for r in results if r.probe.role == BASELINE_ROLE), None)
    challengers = [(r, beats(r.values, inc.values, noise, s.threshold, s.mad_k))
                   for r in results[1:] if r.values and inc.values]
    winners = [c for c in challengers if c[1].improved and c[0].meets(run_cfg.workload.limits)]
    return Findings(
        results=results, target=target,
        verdict=against_history(inc, inc.values, THROUGHPUT, noise),
        per_user=against_history(inc, inc.per_user, PER_USER,
                                 relative_noise([r.per_user for r in results])),
        baseline=base and against_history(base, base.values, THROUGHPUT, noise),
        challengers=challengers, rebased=s.rebase,
        winner=max(winners, key=lambda c: c[1].change, default=None))


def _reference(db: sa.Engine, study: str, trials: Sequence[TrialRecord], key: str,
               metric: tuple, target: int, history: int) -> Reference | None:
    """Earlier nightly runs of this configuration; before any, what the study recorded."""
    column, level, name = metric
    runs = nightly.history(db, study, key, column, history)
    if runs:
        source = "the last nightly run" if len(runs) == 1 else \
            f"median of the last {len(runs)} nightly runs"
        return reference_from_runs(runs, source)
    return _study_reference(trials, key, level or target, name)


def _study_reference(trials: Sequence[TrialRecord], key: str, level: int,
                     name: str) -> Reference | None:
    found = [(t.trial_number, t.measurements[level][name]) for t in trials
             if t.ok and level in t.measurements and t.measurements[level].get(name)
             and t.launch and config_key(t.launch) == key]
    if not found:
        return None
    numbers = ", ".join(str(n) for n, _ in found[:3])
    # Exact (no repeats to weigh): the study measured each trial once, or predicted it.
    return Reference(median([v for _, v in found]), None, f"study trial {numbers}")

