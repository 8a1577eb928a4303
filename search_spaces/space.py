"""SearchSpace: sample a flat parameter dict through Optuna, check constraints, enumerate a grid.

Rules for absent parameters (a parameter whose `when` was false is not in the dict, so the
defaults in ``LaunchParams`` apply):

* a `when` (of a parameter or a constraint) that reads an absent parameter is false;
* a constraint that reads an absent parameter holds: a rule about a knob that is not set does
  not apply. Use a constraint `when` to say so explicitly;
* a bound or a `derive` that reads an absent parameter is an error in the space.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from search_spaces.constraint import Constraint
from search_spaces.errors import SpaceError
from search_spaces.given import GivenTrial
from search_spaces.grid import iter_grid
from search_spaces.params import DerivedParam
from search_spaces.params import Param
from search_spaces.params import is_active


@dataclass(slots=True, frozen=True)
class SearchSpace:
    """A declarative search space, usually loaded from YAML by ``load_space``.

    ``params`` are processed in order; each may read the context and the parameters before
    it. ``context`` names the values the caller must supply (``gpus``, ``num_experts``, ...).
    """

    name: str
    description: str
    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...] = ()
    context: tuple[str, ...] = ()
    source: str = ""

    @property
    def param_names(self) -> tuple[str, ...]:
        """Every parameter name in file order, derived ones included."""
        return tuple(p.name for p in self.params)

    def suggest(self, trial: optuna.trial.BaseTrial, context: Mapping[str, Any]) -> dict[str, Any]:
        """Sample one configuration define-by-run through ``trial.suggest_*``.

        Returns the flat params dict: sampled and derived values, without the parameters whose
        `when` was false. Constraints are not enforced here; see ``violations``.
        """
        env = self._env(context)
        params: dict[str, Any] = {}
        for p in self.params:
            if is_active(p, env):
                params[p.name] = env[p.name] = p.suggest(trial, env)
        return params

    def violations(self, params: Mapping[str, Any], context: Mapping[str, Any]) -> list[str]:
        """The source of every constraint that ``params`` break (empty: feasible)."""
        env = {**self._env(context), **params}
        return [c.source for c in self.constraints if not c.holds(env)]

    def sample(self, context: Mapping[str, Any], rng: random.Random,
               given: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A configuration with ``given``'s values where they fit, random values elsewhere
        (no Optuna study involved; constraints are not enforced, see ``violations``)."""
        return self.suggest(GivenTrial(given or {}, rng), context)  # type: ignore[arg-type]

    def neighbours(self, params: Mapping[str, Any], context: Mapping[str, Any],
                   rng: random.Random, max_points: int = 16) -> list[dict[str, Any]]:
        """Every configuration that differs from ``params`` in one sampled parameter (over its
        discretized domain), completed by ``sample``; constraint-breaking ones are left out."""
        env, found = self._env(context), []
        for p in self.params:
            if not is_active(p, env):
                continue
            if not isinstance(p, DerivedParam):
                for value in p.points(env, max_points):
                    if value != params.get(p.name):
                        found.append(self.sample(context, rng, {**params, p.name: value}))
            if p.name in params:
                env[p.name] = params[p.name]
        unique = {json.dumps(n, sort_keys=True, default=str): n for n in found}
        return [n for n in unique.values() if not self.violations(n, context)]

    def grid(self, context: Mapping[str, Any], max_points_per_param: int = 8) -> Iterator[dict]:
        """Every combination of the discretized space that satisfies the constraints.

        Categoricals give all their choices; a numeric range gives all its values when there
        are at most ``max_points_per_param``, else that many spread over it (log-spaced for
        `log`), both ends included. A generator: the full product can be millions of points.
        """
        if max_points_per_param < 2:
            raise SpaceError(f"{self.source}: max_points_per_param must be >= 2")
        env = self._env(context)
        yield from iter_grid(self.params, self.constraints, env, max_points_per_param)

    def _env(self, context: Mapping[str, Any]) -> dict[str, Any]:
        missing = [n for n in self.context if n not in context]
        if missing:
            raise SpaceError(
                f"{self.source}: space {self.name!r} needs context {', '.join(missing)} "
                f"(given: {', '.join(sorted(context)) or 'nothing'})"
            )
        return {n: context[n] for n in self.context}
