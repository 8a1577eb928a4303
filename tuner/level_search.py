"""On the performance model, each family's best configuration searched at every concurrency.

A study samples configurations for its target concurrency, so at the other levels a family's
best (its envelope, from which `best` and the dashboard read where speculation stops paying:
:mod:`tuner.crossover`) is whatever those samples happened to reach there, which depends on
the sampler's seed. The model prices one configuration at one level in a millisecond or two,
so after the sampled trials each family's best at each level walks through
single-parameter changes that keep its family (algorithm and layout), climbing that level's
output rate, and again from a faster end of its layout moved into the family
(``LevelSearch.best_ends``); a walk that ends on a configuration the study does not hold yet
has it measured as one more trial, so every envelope point is a recorded trial. A measuring
backend is not searched this way (its levels cost launches): `best` says so under the
crossover.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from typing import Any

import optuna

from backends import Backend
from backends import Workload
from search_spaces import SearchSpace
from tuner import records
from tuner.crossover import algorithm_and_layout
from tuner.crossover import family_bests
from tuner.crossover import family_of
from tuner.params import parse
from tuner.selection import config_key
from tuner.study import measure_enqueued

# Single-parameter steps one walk takes at most; it stops sooner where no step helps.
MAX_STEPS = 16
# Trial user attribute of a walk's end: the concurrency level it was searched for.
LEVEL_KEY = "searched_level"


@dataclass(slots=True)
class LevelSearch:
    """Walks at one level at a time, each configuration priced at a level once."""

    space: SearchSpace
    context: dict[str, Any]
    backend: Backend
    workload: Workload
    _priced: dict[tuple[str, int], float] = field(default_factory=dict)

    def output_tok_s(self, params: dict[str, Any], level: int) -> float:
        """The backend's output tok/s of ``params`` at ``level`` (0 where it fails)."""
        key = (config_key(params), level)
        if key not in self._priced:
            self._priced[key] = self._measure(params, level)
        return self._priced[key]

    def best_ends(self, level: int, starts: dict[str, dict[str, Any]]) -> dict[str, dict]:
        """Per family, the best configuration at ``level`` a climb reaches from its start
        (``starts``: family -> configuration); then, where another algorithm's end of the
        same layout is faster, a climb from that one moved into the family, if it gets
        further. One knob at a time a climb cannot cross a pair that only fits together (a
        larger running cap needs the memory fraction that holds its KV cache), which another
        family's end may already have."""
        ends = {family: self.climb(start, level) for family, start in starts.items()}
        rate = lambda p: self.output_tok_s(p, level)  # noqa: E731
        for family in starts:
            layout = algorithm_and_layout(family)[1]
            fastest = max((e for f, e in ends.items() if algorithm_and_layout(f)[1] == layout),
                          key=rate)
            if fastest is ends[family]:
                continue
            moved = self.moved(fastest, family)
            if moved is not None and rate(end := self.climb(moved, level)) > rate(ends[family]):
                ends[family] = end
        return ends

    def moved(self, params: dict[str, Any], family: str) -> dict[str, Any] | None:
        """``params`` with the speculative algorithm of ``family`` (the knobs that only that
        algorithm has drawn afresh); None where the result breaks the space's constraints."""
        if _family(params) == family:
            return params
        algorithm, _ = algorithm_and_layout(family)
        rng = random.Random(f"{family}/{config_key(params)}")
        moved = self.space.sample(self.context, rng,
                                  {**params, "speculative_algorithm": algorithm})
        if self.space.violations(moved, self.context) or _family(moved) != family:
            return None
        return moved

    def climb(self, params: dict[str, Any], level: int) -> dict[str, Any]:
        """Best-improvement steps from ``params`` through single-parameter changes that keep
        its family, on the output rate at ``level``; the configuration where no step helps."""
        family = _family(params)
        rng = random.Random(f"{level}/{config_key(params)}")
        value = self.output_tok_s(params, level)
        for _ in range(MAX_STEPS):
            steps = [n for n in self.space.neighbours(params, self.context, rng)
                     if _family(n) == family]
            best = max(steps, key=lambda n: self.output_tok_s(n, level), default=None)
            if best is None or self.output_tok_s(best, level) <= value:
                break
            params, value = best, self.output_tok_s(best, level)
        return params

    def _measure(self, params: dict[str, Any], level: int) -> float:
        launch, _ = parse(params)
        if launch is None:
            return 0.0
        rows = self.backend.measure(launch, replace(self.workload, concurrency=(level,)))
        return next((m.output_tok_s for m in rows if m.ok), 0.0)


def walk_starts(trials: list[records.TrialRecord]) -> dict[int, dict[str, dict[str, Any]]]:
    """Per level, each family's best configuration there among ``trials``' successful ones."""
    return {level: {family: params for family, (_, params) in by_family.items()}
            for level, by_family in family_bests(trials).items()}


def search_levels(search: LevelSearch, study: optuna.Study, objective: Callable,
                  starts: dict[int, dict[str, dict[str, Any]]], held: set[str],
                  catch: tuple[type[Exception], ...], stop: Callable[[], bool],
                  on_level: Callable[[], None] = lambda: None) -> int:
    """The best ends of the walks from ``starts`` (``walk_starts``), level by level; each
    whose ``config_key`` is not in ``held`` (the study's trials) is measured by ``objective``
    as a trial of ``study``. Returns how many were."""
    added = 0
    for level, by_family in starts.items():
        if stop():
            break
        for end in search.best_ends(level, by_family).values():
            if config_key(end) not in held:
                held.add(config_key(end))
                measure_enqueued(study, objective, end, catch, **{LEVEL_KEY: level})
                added += 1
        on_level()
    return added


def _family(params: dict[str, Any]) -> str | None:
    launch, _ = parse(params)
    return family_of(launch) if launch is not None else None
