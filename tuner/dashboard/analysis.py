"""What the views summarise: family envelopes, the crossover, the configurations worth a look."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tuner.dashboard.data import FAMILIES
from tuner.dashboard.data import StudyData
from tuner.dashboard.data import TrialView


@dataclass(slots=True)
class Crossover:
    levels: list[int]
    speedup: list[float | None]  # best speculative / best AR output tok/s, per level
    stops_at: int | None  # first level from which speculation no longer beats AR
    note: str


def envelopes(trials: list[TrialView]) -> dict[str, dict[int, float]]:
    """Per family, the best output tok/s any of its configurations reached at each level: what
    the family can do at that load, whichever of its configurations you would pick there."""
    best: dict[str, dict[int, float]] = {}
    for t in trials:
        if not t.ok or t.family is None:
            continue
        curve = best.setdefault(t.family, {})
        for level, m in t.levels.items():
            if m.get("output_tok_s") is not None:
                curve[level] = max(curve.get(level, 0.0), m["output_tok_s"])
    return {f: dict(sorted(best[f].items())) for f in FAMILIES if f in best}


def crossover(curves: dict[str, dict[int, float]]) -> Crossover:
    ar = best_of(curves, spec=False)
    spec = best_of(curves, spec=True)
    levels = sorted(set(ar) & set(spec))
    if not levels:
        missing = "plain (AR)" if not ar else "speculative"
        return Crossover([], [], None, f"no successful {missing} configuration to compare with")
    speedup = [spec[c] / ar[c] if ar[c] > 0 else None for c in levels]
    losing = [c for c, s in zip(levels, speedup, strict=True) if s is not None and s <= 1.0]
    stops = next((c for c in levels if all(x in losing for x in levels if x >= c)), None)
    # Levels lost before speculation pays again (a kernel switch can make one level lose).
    dips = ", ".join(str(c) for c in losing if stops is None or c < stops)
    if stops == levels[0]:
        note = "speculation never beats plain decoding here"
    elif stops is not None:
        note = f"speculation stops paying from concurrency {stops}"
        note += f" (and loses at {dips})" if dips else ""
    elif dips:
        note = f"speculation beats plain decoding at every measured concurrency but {dips}"
    else:
        note = "speculation beats plain decoding at every measured concurrency"
    return Crossover(levels, speedup, stops, note)


def best_of(curves: dict[str, dict[int, float]], spec: bool) -> dict[int, float]:
    best: dict[int, float] = {}
    for family, curve in curves.items():
        if family.startswith("AR") == spec:
            continue
        for level, value in curve.items():
            best[level] = max(best.get(level, 0.0), value)
    return best


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
