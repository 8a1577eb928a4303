"""A rule a sampled configuration must satisfy (with the rules for absent parameters in
:mod:`search_spaces.space`)."""

from __future__ import annotations

from dataclasses import dataclass

from search_spaces.expr import Env
from search_spaces.expr import Expr


@dataclass(slots=True, frozen=True)
class Constraint:
    """``expr`` must hold whenever ``when`` does (always, if ``when`` is None)."""

    expr: Expr
    when: Expr | None = None

    @property
    def source(self) -> str:
        return self.expr.source

    def holds(self, env: Env) -> bool:
        if self.when is not None and not self.when.holds(env, if_unset=False):
            return True
        return self.expr.holds(env, if_unset=True)
