"""Choose the configuration to run: feasible under the SLA, on the Pareto front, best score.

Works on our own records only (no Optuna import), so ``best`` starts fast and a different SLA
can be applied after the fact. Trials of one configuration (re-measurements in fresh launches)
form one candidate: its numbers are medians, and it is ranked by a lower bound (median minus a
spread penalty, see :mod:`tuner.stats`), so a configuration that was lucky once does not win.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Literal

from backends.contract import FailureClass
from tuner import stats
from tuner.errors import NoResultError
from tuner.records import GATES_PASSED
from tuner.records import TrialRecord
from tuner.sla import SLA_METRICS
from tuner.sla import Limit
from tuner.sla import meets

# Where a trial's throughput is read: at the workload's target concurrency, or at the highest
# concurrency that met the SLA (what a launch-aware study searches for in every launch).
ObjectivePoint = Literal["at_target", "at_sla_limit"]
_TRANSIENT = frozenset(f.value for f in FailureClass if not f.is_deterministic)


@dataclass(slots=True, frozen=True)
class Ranking:
    """How runs of one configuration become one score."""

    point: ObjectivePoint = "at_target"
    min_runs: int = 1  # runs a configuration needs before it can be chosen
    penalty: float = 1.0  # standard errors subtracted from the median
    prior_rel_sd: float = 0.0  # assumed noise while a configuration has < 3 runs
    gated_only: bool = False  # only configurations with a launch that passed the gates
    winner: str | None = None  # config key the study's own finals chose: chosen if it qualifies


@dataclass(slots=True, frozen=True)
class Candidate:
    trial: TrialRecord  # the configuration's first successful run
    throughput: float  # median output tok/s at the objective point
    per_user: float  # median tok/s per user at concurrency 1
    runs: int = 1
    score: float = 0.0  # what throughput is ranked by
    gated: bool = False  # one of its launches passed the integrity gates
    concurrency: int = 0  # the level throughput was read at (the first run's)
    metrics: dict[str, float] = field(default_factory=dict)  # medians of that level's numbers

    @property
    def params(self) -> dict:
        return self.trial.params


def config_key(params: dict) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def read_level(t: TrialRecord, target: int, limits: Sequence[Limit],
               point: ObjectivePoint = "at_target") -> int | None:
    """The concurrency a successful trial's throughput is read at, None when no level counts:
    ``target`` if it met the SLA there, or (at_sla_limit) its fastest level within the SLA."""
    if not t.ok or 1 not in t.measurements:
        return None
    if point == "at_target":
        row = t.measurements.get(target)
        return target if row is not None and meets(row, limits) else None
    ok = [c for c, row in t.measurements.items() if meets(row, limits)]
    return max(ok, key=lambda c: t.measurements[c]["output_tok_s"], default=None)


def candidates(trials: Sequence[TrialRecord], target: int, limits: Sequence[Limit],
               ranking: Ranking = Ranking()) -> list[Candidate]:
    """One candidate per configuration whose every run succeeded within the SLA; a run that
    failed transiently (a retry would not fail the same way) is ignored."""
    runs: dict[str, list[TrialRecord]] = defaultdict(list)
    for t in trials:
        if t.measured and t.status not in _TRANSIENT:
            runs[config_key(t.params)].append(t)
    found = []
    for group in runs.values():
        if not all(t.ok for t in group):  # a crash, an OOM, a failed gate: the config is out
            continue
        levels = [read_level(t, target, limits, ranking.point) for t in group]
        if all(c is not None for c in levels):
            found.append(_candidate(list(zip(group, levels)), ranking))
    return found


def _candidate(ok: list[tuple[TrialRecord, int]], ranking: Ranking) -> Candidate:
    rows = [t.measurements[c] for t, c in ok]
    rates = [row["output_tok_s"] for row in rows]
    return Candidate(ok[0][0], stats.median(rates),
                     stats.median([t.measurements[1]["tok_s_per_user"] for t, _ in ok]),
                     runs=len(ok),
                     score=stats.lower_bound(rates, ranking.penalty, ranking.prior_rel_sd),
                     gated=any(t.log_excerpt.startswith(GATES_PASSED) for t, _ in ok),
                     concurrency=ok[0][1], metrics=_medians(rows))


def _medians(rows: list[dict]) -> dict[str, float]:
    """Each metric's median over the runs that have it (the model leaves some unset)."""
    values = {name: [row[name] for row in rows if row.get(name) is not None]
              for name in SLA_METRICS}
    return {name: stats.median(v) for name, v in values.items() if v}


def pareto_front(cands: Sequence[Candidate]) -> list[Candidate]:
    """Candidates no other candidate beats on both score and per-user speed, best score first;
    of configurations with identical results the first one stands."""
    front = [c for c in cands if not any(_dominates(o, c) for o in cands)]
    front.sort(key=lambda c: (-c.score, -c.per_user, c.trial.trial_number))
    unique: dict[tuple[float, float], Candidate] = {}
    for c in front:
        unique.setdefault((round(c.score, 6), round(c.per_user, 6)), c)
    return list(unique.values())


def choose(trials: Sequence[TrialRecord], target: int, limits: Sequence[Limit],
           unusable: Callable[[TrialRecord], str | None] = lambda t: None,
           ranking: Ranking = Ranking()) -> tuple[Candidate, list[Candidate]]:
    """The chosen candidate and the Pareto front it came from; NoResultError when none.
    ``unusable`` says why the requested engine cannot launch a trial (None: it can)."""
    if not trials:
        raise NoResultError("the study has no trials yet; run `dflash-tune run` first")
    ok = [t for t in trials if t.ok]
    if not ok:
        measured = sum(1 for t in trials if t.measured)
        rejected = len(trials) - measured
        also = f" ({rejected} more samples broke the space's constraints)" if rejected else ""
        raise NoResultError(f"all {measured} measured trials failed{also}; nothing to choose from")
    meeting = candidates(trials, target, limits, ranking)
    sla = ", ".join(map(str, limits)) or "none"
    where = "at its SLA limit" if ranking.point == "at_sla_limit" else f"at concurrency {target}"
    if not meeting:
        raise NoResultError(f"no successful configuration meets the SLA ({sla}) {where}"
                            + (_most_missed(ok, target, limits) if ranking.point == "at_target"
                               else ""))
    cands = [c for c in meeting if unusable(c.trial) is None]
    if not cands:
        raise NoResultError(f"none of the {len(meeting)} configurations that meet the SLA "
                            f"({sla}) {where} can be launched by the requested engine: "
                            f"{unusable(meeting[0].trial)}")
    confirmed = [c for c in cands if c.runs >= ranking.min_runs
                 and (c.gated or not ranking.gated_only)]
    if not confirmed and ranking.gated_only:
        raise NoResultError("no configuration has passed the integrity gates yet; run "
                            "`dflash-tune run` again (or raise tuning.launches) to finish the "
                            "finals")
    if not confirmed:
        raise NoResultError(
            f"no configuration has been measured {ranking.min_runs} times yet (measurements are "
            "noisy; a single good run proves little); `dflash-tune run` re-measures the "
            "finalists in fresh launches when its trials are done, or set tuning.repeats: 1 to "
            "accept single runs")
    front = pareto_front(confirmed)
    crowned = next((c for c in confirmed if config_key(c.params) == ranking.winner), None)
    if crowned is None:
        return front[0], front
    return crowned, [crowned] + [c for c in front if c is not crowned]


def _most_missed(ok: Sequence[TrialRecord], target: int, limits: Sequence[Limit]) -> str:
    """Which limit rules out the most successful trials at ``target`` (the one to look at)."""
    rows = [t.measurements[target] for t in ok if target in t.measurements]
    missed = {limit: sum(1 for row in rows if limit.violation(row.get(limit.metric)) > 0)
              for limit in limits}
    worst = max(missed, key=missed.get, default=None)
    if worst is None or not missed[worst]:
        return ""
    return f"; {worst} is missed by {missed[worst]} of the {len(rows)} successful trials"


def _dominates(a: Candidate, b: Candidate) -> bool:
    return (a.score >= b.score and a.per_user >= b.per_user
            and (a.score > b.score or a.per_user > b.per_user))
