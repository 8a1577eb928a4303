"""What the views summarise: the configurations worth a look, the failures."""

from __future__ import annotations

from collections import Counter

from tuner.dashboard.data import StudyData
from tuner.dashboard.data import TrialView


def best_few(data: StudyData, n: int = 5) -> list[TrialView]:
    """The chosen configuration, then the rest of the Pareto front, then the fastest feasible
    and finally the fastest successful ones, until there are ``n``."""
    order = ([data.chosen] if data.chosen is not None else []) + data.front
    by_speed = sorted(data.ok_trials, key=lambda t: -(t.metric(data.target, "output_tok_s") or 0))
    order += [t.number for t in by_speed if t.feasible] + [t.number for t in by_speed]
    picked = list(dict.fromkeys(order))[:n]
    return [data.trial(number) for number in picked]


REJECTED = "rejected"  # a sample the space's constraints rejected before any backend saw it


def outcome(t: TrialView) -> str:
    return t.status if t.measured else REJECTED


def failure_counts(trials: list[TrialView]) -> dict[str, int]:
    """Trials by outcome, successes first, then the most frequent failure."""
    counts = Counter(outcome(t) for t in trials)
    ok = {"ok": counts.pop("ok")} if "ok" in counts else {}
    return ok | dict(counts.most_common())


def failure_examples(trials: list[TrialView]) -> dict[str, TrialView]:
    """The latest trial of each failure class, for its log excerpt."""
    latest: dict[str, TrialView] = {}
    for t in trials:
        if not t.ok:
            latest[outcome(t)] = t
    return latest
