"""Parameter kinds: how each one is sampled through Optuna and enumerated by a grid.

Bounds are expressions evaluated against the context and the parameters chosen before, so
`speculative_ddtree_budget` can start at `speculative_dflash_block_size - 1`. Every kind has
``suggest(trial, env)``, ``points(env, max_points)`` and ``reads`` (the names its value or
bounds depend on); the space calls them without caring which kind it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from decimal import Decimal
from typing import Any
from typing import Union

import optuna

from search_spaces.errors import SpaceError
from search_spaces.expr import Env
from search_spaces.expr import Expr

Choice = Union[bool, int, float, str, None]


@dataclass(slots=True, frozen=True)
class IntParam:
    """Integer in [low, high] on a ``step`` grid, or log-uniform (``log``, step 1)."""

    name: str
    low: Expr
    high: Expr
    step: int = 1
    log: bool = False
    when: Expr | None = None
    where: str = field(default="", compare=False)

    @property
    def reads(self) -> frozenset[str]:
        return self.low.names | self.high.names

    def suggest(self, trial: optuna.trial.BaseTrial, env: Env) -> int:
        low, high = self.bounds(env)
        return trial.suggest_int(self.name, low, high, step=self.step, log=self.log)

    def points(self, env: Env, max_points: int) -> list[int]:
        low, high = self.bounds(env)
        count = (high - low) // self.step + 1
        if count <= max_points:
            return list(range(low, high + 1, self.step))
        if self.log:
            return _dedupe(round(v) for v in _geomspace(low, high, max_points))
        return [low + i * self.step for i in _spread(count - 1, max_points)]

    def bounds(self, env: Env) -> tuple[int, int]:
        """Evaluated bounds, high rounded down onto the step grid (Optuna would warn)."""
        low, high = _as_int(self.low, env), _as_int(self.high, env)
        _check_range(self.where, low, high, self.log)
        return low, low + (high - low) // self.step * self.step


@dataclass(slots=True, frozen=True)
class FloatParam:
    """Float in [low, high]: uniform, on a ``step`` grid, or log-uniform (``log``)."""

    name: str
    low: Expr
    high: Expr
    step: float | None = None
    log: bool = False
    when: Expr | None = None
    where: str = field(default="", compare=False)

    @property
    def reads(self) -> frozenset[str]:
        return self.low.names | self.high.names

    def suggest(self, trial: optuna.trial.BaseTrial, env: Env) -> float:
        low, high = self.bounds(env)
        return trial.suggest_float(self.name, low, high, step=self.step, log=self.log)

    def points(self, env: Env, max_points: int) -> list[float]:
        low, high = self.bounds(env)
        if self.step is not None:
            count = _steps(low, high, self.step) + 1
            index = range(count) if count <= max_points else _spread(count - 1, max_points)
            return [_on_grid(low, i, self.step) for i in index]
        if low == high:
            return [low]
        spread = _geomspace if self.log else _linspace
        return _dedupe(round(v, 12) for v in spread(low, high, max_points))

    def bounds(self, env: Env) -> tuple[float, float]:
        """Evaluated bounds, high rounded down onto the step grid (Optuna would warn)."""
        low, high = _as_float(self.low, env), _as_float(self.high, env)
        _check_range(self.where, low, high, self.log)
        if self.step is not None:
            high = _on_grid(low, _steps(low, high, self.step), self.step)
        return low, high


@dataclass(slots=True, frozen=True)
class CategoricalParam:
    """One of a fixed tuple of choices (Optuna needs them static)."""

    name: str
    choices: tuple[Choice, ...]
    when: Expr | None = None
    where: str = field(default="", compare=False)

    @property
    def reads(self) -> frozenset[str]:
        return frozenset()

    def suggest(self, trial: optuna.trial.BaseTrial, env: Env) -> Choice:
        return trial.suggest_categorical(self.name, self.choices)

    def points(self, env: Env, max_points: int) -> list[Choice]:
        return list(self.choices)  # every choice, whatever max_points says


@dataclass(slots=True, frozen=True)
class DerivedParam:
    """Computed from the context and earlier parameters; never sampled."""

    name: str
    expr: Expr
    when: Expr | None = None
    where: str = field(default="", compare=False)

    @property
    def reads(self) -> frozenset[str]:
        return self.expr.names

    def suggest(self, trial: optuna.trial.BaseTrial, env: Env) -> Any:
        return self.expr.evaluate(env)

    def points(self, env: Env, max_points: int) -> list[Any]:
        return [self.expr.evaluate(env)]


Param = Union[IntParam, FloatParam, CategoricalParam, DerivedParam]


def is_active(param: Param, env: Env) -> bool:
    """Whether ``param`` is set: its `when` holds (a `when` reading an unset name does not)."""
    return param.when is None or param.when.holds(env, if_unset=False)


def _as_int(expr: Expr, env: Env) -> int:
    value = expr.evaluate(env)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpaceError(f"{expr.where}: {expr.source!r} gave {value!r}, not an integer")
    return value


def _as_float(expr: Expr, env: Env) -> float:
    value = expr.evaluate(env)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpaceError(f"{expr.where}: {expr.source!r} gave {value!r}, not a number")
    return float(value)


def _check_range(where: str, low: float, high: float, log: bool) -> None:
    if low > high:
        raise SpaceError(f"{where}: low {low} > high {high}")
    if log and low <= 0:
        raise SpaceError(f"{where}: log scale needs low > 0, got {low}")


def _steps(low: float, high: float, step: float) -> int:
    # Decimal, because (0.92 - 0.80) / 0.02 is 5.999... in floats and would drop 0.92.
    return int((Decimal(str(high)) - Decimal(str(low))) // Decimal(str(step)))


def _on_grid(low: float, index: int, step: float) -> float:
    return float(Decimal(str(low)) + index * Decimal(str(step)))


def _spread(last: int, n: int) -> list[int]:
    """``n`` indices spread evenly over 0..last, both ends included."""
    return _dedupe(round(i * last / (n - 1)) for i in range(n))


def _linspace(low: float, high: float, n: int) -> list[float]:
    return [low + (high - low) * i / (n - 1) for i in range(n)]


def _geomspace(low: float, high: float, n: int) -> list[float]:
    inner = [low * (high / low) ** (i / (n - 1)) for i in range(1, n - 1)]
    return [low, *inner, high]  # exact ends: pow() can land on 127.99999 for 128


def _dedupe(values: Any) -> list[Any]:
    return list(dict.fromkeys(values))
