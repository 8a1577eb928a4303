"""Where speculation stops paying: per family (algorithm x layout), the best output rate any of
its configurations reached at each concurrency, and the best speculative over the best plain
one, level by level. ``best`` prints it under its table and the dashboard draws it."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from backends.launch_params import LaunchParams
from tuner.config import Config
from tuner.records import TrialRecord
from tuner.selection import config_key
from tuner.wiring import model_speedup_error

ALGORITHMS = {"none": "AR", "dflash": "DFlash", "ddtree": "DDTree"}
# Fixed order so a family keeps its colour from one report to the next.
FAMILIES = tuple(f"{alg} · {layout}" for alg in ALGORITHMS.values() for layout in ("TP", "EP"))


def family_of(lp: LaunchParams) -> str:
    layout = "EP" if lp.ep_size > 1 else "TP"
    return f"{ALGORITHMS[lp.speculative_algorithm]} · {layout}"


def algorithm_and_layout(family: str) -> tuple[str, str]:
    """``("dflash", "TP")`` for ``"DFlash · TP"``: the launch's speculative_algorithm."""
    shown, layout = family.split(" · ")
    return next(a for a, name in ALGORITHMS.items() if name == shown), layout


@dataclass(slots=True)
class Crossover:
    levels: list[int]
    speedup: list[float | None]  # best speculative / best AR output tok/s, per level
    stops_at: int | None  # first level from which speculation no longer beats AR
    note: str
    caveat: str = ""  # what the levels do not show or cannot tell, if anything
    # The predictions' own speedup error (0 for measured levels): a speedup within a factor
    # 1 + margin of 1.0 either way is too close to call.
    margin: float = 0.0
    within_error_from: int | None = None  # first level from which every level is that close
    within_error_at: list[int] = field(default_factory=list)  # every level that close
    # What a measurement at ``settle_at`` must compare: the fastest plain and the fastest
    # speculative configuration the study holds there, as (trial number, launch label).
    to_measure: list[tuple[int, str]] = field(default_factory=list)

    @property
    def settle_at(self) -> int | None:
        """The level a measurement should settle: the first of the close tail (where
        speculation may stop paying), else the first close level."""
        return self.within_error_from or next(iter(self.within_error_at), None)

    def line(self) -> str:
        """``1: 1.85x · 4: 0.98x ...; <note> (<caveat>)``, or the note alone."""
        shown = " · ".join(f"{c}: {s:.2f}x" for c, s in zip(self.levels, self.speedup,
                                                              strict=True) if s is not None)
        return f"{shown}; {self.verdict()}" if shown else self.verdict()

    def verdict(self) -> str:
        """``<note> (<caveat>)``, or the note alone."""
        return f"{self.note} ({self.caveat})" if self.caveat else self.note

    def settle_line(self) -> str:
        """``to settle it at concurrency 128, measure trial 7 (...) against trial 9 (...)
        (`dflash-tune export --trial 7 --trial 9` has their launch commands)``, or ""."""
        if not self.to_measure:
            return ""
        pair = " against ".join(f"trial {n} ({label})" for n, label in self.to_measure)
        export = " ".join(f"--trial {n}" for n, _ in self.to_measure)
        return (f"to settle it at concurrency {self.settle_at}, measure {pair} (`dflash-tune "
                f"export {export}` has their launch commands)")

    def as_dict(self) -> dict[str, Any]:
        return {"by_concurrency": [{"concurrency": c, "speedup": s} for c, s
                                   in zip(self.levels, self.speedup, strict=True)],
                "stops_paying_at": self.stops_at, "note": self.note, "caveat": self.caveat,
                "margin": self.margin, "within_error_from": self.within_error_from,
                "within_error_at": self.within_error_at, "settle_at": self.settle_at,
                "to_measure": [{"trial": n, "configuration": label}
                               for n, label in self.to_measure]}


def envelopes(trials: Iterable[TrialRecord]) -> dict[str, dict[int, float]]:
    """Per family, the best output tok/s any of its configurations reached at each level (a
    configuration measured more than once by the median of its runs): what the family can do
    at that load, whichever of its configurations you would pick there."""
    best = family_bests(trials)
    return {f: {level: by_family[f][0] for level, by_family in best.items() if f in by_family}
            for f in FAMILIES if any(f in by_family for by_family in best.values())}


def family_bests(trials: Iterable[TrialRecord]
                 ) -> dict[int, dict[str, tuple[float, dict[str, Any]]]]:
    """Per level (ascending), each family's fastest configuration there: its output tok/s (by
    the median of its runs) and its params."""
    best: dict[int, dict[str, tuple[float, dict[str, Any]]]] = {}
    for family, params, curve in configuration_curves(trials):
        for level, value in curve.items():
            by_family = best.setdefault(level, {})
            if family not in by_family or value > by_family[family][0]:
                by_family[family] = (value, params)
    return dict(sorted(best.items()))


def configuration_curves(trials: Iterable[TrialRecord]
                         ) -> list[tuple[str, dict[str, Any], dict[int, float]]]:
    """(family, params, output tok/s per level) of each configuration with a successful trial,
    a configuration measured more than once by the median of its runs at each level."""
    runs: dict[str, tuple[str, dict[str, Any], dict[int, list[float]]]] = {}
    for t in trials:
        if not t.ok or t.launch is None:
            continue
        _, _, levels = runs.setdefault(config_key(t.params),
                                       (family_of(t.launch), t.params, defaultdict(list)))
        for level, m in t.measurements.items():
            if m.get("output_tok_s") is not None:
                levels[level].append(m["output_tok_s"])
    return [(family, params, {level: statistics.median(v) for level, v in levels.items()})
            for family, params, levels in runs.values()]


def study_crossover(trials: list[TrialRecord], cfg: Config) -> Crossover:
    """The crossover of the trials of the study ``cfg`` ran. Predicted by the performance model,
    its levels are searched one by one (:mod:`tuner.level_search`) and each speedup is as good
    as the model's error on published speedups; measured by a real engine, only its target
    level was searched, or (``launch_aware``) each launch measured where its search for its own
    SLA limit went."""
    measured = any(t.engine_measured for t in trials)
    launch_aware = cfg.tuning.strategy == "launch_aware"
    cross = crossover(envelopes(trials), margin=0.0 if measured else model_speedup_error(cfg),
                      sampled_for=cfg.workload.target_concurrency
                      if measured and not launch_aware else None,
                      sla_limits=measured and launch_aware)
    if cross.settle_at is not None:
        cross.to_measure = [(t.trial_number, t.launch.label())
                            for t in fastest_at(trials, cross.settle_at)]
    return cross


def fastest_at(trials: list[TrialRecord], level: int) -> list[TrialRecord]:
    """The first trial of the fastest plain and of the fastest speculative configuration at
    ``level`` (a configuration by the median of its runs), plain first."""
    fastest: dict[bool, tuple[float, dict[str, Any]]] = {}
    for family, (value, params) in family_bests(trials).get(level, {}).items():
        spec = not family.startswith("AR")
        if spec not in fastest or value > fastest[spec][0]:
            fastest[spec] = (value, params)
    first: dict[str, TrialRecord] = {}
    for t in trials:
        if t.ok and t.launch is not None:
            first.setdefault(config_key(t.params), t)
    return [first[config_key(fastest[spec][1])] for spec in (False, True) if spec in fastest]


def crossover(curves: dict[str, dict[int, float]], sampled_for: int | None = None,
              margin: float = 0.0, sla_limits: bool = False) -> Crossover:
    """Best speculative over best plain output rate per level. How a real engine's study
    chose what to launch, which the caveat then says: ``sampled_for`` its target concurrency
    alone (:mod:`tuner.level_search` searches every level only on the performance model), or
    ``sla_limits``: each launch its own SLA limit, its levels those its search measured.
    ``margin``: the relative error of a predicted speedup; at every level within it of
    parity, the caveat says the two are too close to call."""
    cross = _crossover(curves)
    if sla_limits and cross.levels:
        cross.caveat = ("each level is one where some launch's search for its own SLA limit "
                        "measured, not a sweep of each configuration")
    elif sampled_for is not None and len(cross.levels) > 1:
        cross.caveat = (f"levels other than {sampled_for} show what configurations chosen for "
                        f"{sampled_for} reached there, not a search of each")
    if margin > 0:
        _mark_within_error(cross, margin)
    return cross


def _mark_within_error(cross: Crossover, margin: float) -> None:
    close = [s is not None and 1 / (1 + margin) <= s <= 1 + margin for s in cross.speedup]
    cross.margin = margin
    cross.within_error_at = [c for c, near in zip(cross.levels, close, strict=True) if near]
    cross.within_error_from = next((c for i, c in enumerate(cross.levels) if all(close[i:])),
                                   None)
    if not cross.within_error_at:
        return
    said = (f"{_where(cross)} the two are within the model's speedup error of +-{margin:.0%}: "
            "measure there before relying on it")
    cross.caveat = f"{cross.caveat}; {said}" if cross.caveat else said


def _where(cross: Crossover) -> str:
    """``at every level``, ``from concurrency 128 on,``, ``at concurrency 4 and 16,`` or
    ``at concurrency 4 and from concurrency 128 on,``: the levels too close to call."""
    tail = cross.within_error_from
    if tail == cross.levels[0]:
        return "at every level"
    isolated = [c for c in cross.within_error_at if tail is None or c < tail]
    shown = [f"at concurrency {_listed(isolated)}"] if isolated else []
    shown += [f"from concurrency {tail} on"] if tail is not None else []
    return " and ".join(shown) + ","


def _listed(levels: list[int]) -> str:
    """``4``, ``4 and 16``, ``4, 8 and 16``."""
    words = [str(c) for c in levels]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _crossover(curves: dict[str, dict[int, float]]) -> Crossover:
    ar = best_of(curves, spec=False)
    spec = best_of(curves, spec=True)
    levels = sorted(set(ar) & set(spec))
    if not levels:
        missing = "plain (AR)" if not ar else "speculative"
        return Crossover([], [], None, f"no successful {missing} configuration to compare with")
    speedup = [spec[c] / ar[c] if ar[c] > 0 else None for c in levels]
    losing = [c for c, s in zip(levels, speedup, strict=True) if s is not None and s <= 1.0]
    stops = next((c for c in levels if all(x in losing for x in levels if x >= c)), None)
    # Levels lost before speculation pays again (at a few requests a verify touches several
    # times the experts a plain step does, a gap that narrows once every expert is touched).
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
    """The best of the speculative (``spec``) or of the plain families' curves, per level."""
    best: dict[int, float] = {}
    for family, curve in curves.items():
        if family.startswith("AR") == spec:
            continue
        for level, value in curve.items():
            best[level] = max(best.get(level, 0.0), value)
    return best
