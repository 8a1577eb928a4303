"""Exhaustive enumeration of a discretized space, pruned by constraints as early as possible."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from search_spaces.constraint import Constraint
from search_spaces.params import Param
from search_spaces.params import is_active

_ABSENT = object()  # the value of a param whose `when` is false: not put in the dict


def iter_grid(
    params: tuple[Param, ...],
    constraints: tuple[Constraint, ...],
    env: dict[str, Any],
    max_points: int,
) -> Iterator[dict[str, Any]]:
    """Depth-first over ``params`` in order; ``env`` holds the context and is extended."""
    walk = _Walk(params, _checkpoints(params, constraints), max_points, env)
    if all(c.holds(env) for c in walk.ready[0]):
        yield from walk.run(0)


@dataclass(slots=True)
class _Walk:
    params: tuple[Param, ...]
    ready: list[list[Constraint]]  # [i]: constraints decidable once i params are chosen
    max_points: int
    env: dict[str, Any]
    chosen: dict[str, Any] = field(default_factory=dict)
    # Points depend only on the earlier params a bound reads (most read none), so a param's
    # points are computed once per distinct value of those, not once per branch.
    cache: dict[tuple[Any, ...], list[Any]] = field(default_factory=dict)

    def run(self, i: int) -> Iterator[dict[str, Any]]:
        if i == len(self.params):
            yield dict(self.chosen)
            return
        name = self.params[i].name
        for value in self._values(i):
            if value is not _ABSENT:
                self.chosen[name] = self.env[name] = value
            if all(c.holds(self.env) for c in self.ready[i + 1]):
                yield from self.run(i + 1)
        self.chosen.pop(name, None)
        self.env.pop(name, None)

    def _values(self, i: int) -> list[Any]:
        param = self.params[i]
        if not is_active(param, self.env):
            return [_ABSENT]
        # Typed, because 1 == True would share a key but may not give the same points.
        values = (self.chosen.get(n, _ABSENT) for n in sorted(param.reads))
        key = (i, *((type(v), v) for v in values))
        if key not in self.cache:
            self.cache[key] = param.points(self.env, self.max_points)
        return self.cache[key]


def _checkpoints(
    params: tuple[Param, ...], constraints: tuple[Constraint, ...]
) -> list[list[Constraint]]:
    """Constraints grouped by how many leading params must be chosen to decide them."""
    position = {p.name: i + 1 for i, p in enumerate(params)}
    ready: list[list[Constraint]] = [[] for _ in range(len(params) + 1)]
    for c in constraints:
        names = c.expr.names | (c.when.names if c.when else frozenset())
        ready[max((position.get(n, 0) for n in names), default=0)].append(c)
    return ready
