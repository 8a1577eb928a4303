"""Choose the configuration to run: feasible under the SLA, on the Pareto front, best throughput.

Works on our own records only (no Optuna import), so ``best`` starts fast and a different SLA
can be applied after the fact.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.errors import NoResultError
from tuner.records import TrialRecord
from tuner.sla import Limit


@dataclass(slots=True, frozen=True)
class Candidate:
    trial: TrialRecord
    throughput: float  # output tok/s at the target concurrency
    per_user: float  # tok/s per user at concurrency 1


def candidates(trials: Sequence[TrialRecord], target: int,
               limits: Sequence[Limit]) -> list[Candidate]:
    """Successful trials that meet every limit at the target concurrency."""
    found = []
    for t in trials:
        at_target, at_one = t.measurements.get(target), t.measurements.get(1)
        if not t.ok or at_target is None or at_one is None:
            continue
        if all(limit.violation(at_target.get(limit.metric)) <= 0 for limit in limits):
            found.append(Candidate(t, at_target["output_tok_s"], at_one["tok_s_per_user"]))
    return found


def pareto_front(cands: Sequence[Candidate]) -> list[Candidate]:
    """Candidates no other candidate beats on both objectives, best throughput first; of trials
    with identical results (the same configuration sampled twice) the first one stands."""
    front = [c for c in cands if not any(_dominates(o, c) for o in cands)]
    front.sort(key=lambda c: (-c.throughput, -c.per_user, c.trial.trial_number))
    unique: dict[tuple[float, float], Candidate] = {}
    for c in front:
        unique.setdefault((round(c.throughput, 6), round(c.per_user, 6)), c)
    return list(unique.values())


def choose(trials: Sequence[TrialRecord], target: int, limits: Sequence[Limit],
           usable: Callable[[TrialRecord], bool] = lambda t: True) -> tuple[Candidate, list[Candidate]]:
    """The chosen candidate and the Pareto front it came from; NoResultError when none."""
    if not trials:
        raise NoResultError("the study has no trials yet; run `dflash-tune run` first")
    ok = [t for t in trials if t.ok]
    if not ok:
        measured = sum(1 for t in trials if t.measured)
        rejected = len(trials) - measured
        also = f" ({rejected} more samples broke the space's constraints)" if rejected else ""
        raise NoResultError(f"all {measured} measured trials failed{also}; nothing to choose from")
    cands = [c for c in candidates(ok, target, limits) if usable(c.trial)]
    if not cands:
        sla = ", ".join(map(str, limits)) or "none"
        raise NoResultError(f"no successful trial meets the SLA ({sla}) at concurrency {target}"
                            " for the requested engine")
    front = pareto_front(cands)
    return front[0], front


def _dominates(a: Candidate, b: Candidate) -> bool:
    return (a.throughput >= b.throughput and a.per_user >= b.per_user
            and (a.throughput > b.throughput or a.per_user > b.per_user))
