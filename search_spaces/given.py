"""A stand-in for an Optuna trial that answers from a dict of values, else draws at random.

It lets the space complete a partial configuration the way sampling would (derived values
recomputed, parameters whose `when` turned true filled in, the rest left out) without an Optuna
study: the launch-aware tuner screens thousands of configurations on the performance model and
walks their neighbourhoods, which an Optuna study per evaluation would make slow.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any


class GivenTrial:
    def __init__(self, values: Mapping[str, Any], rng: random.Random) -> None:
        self.values, self.rng = values, rng

    def suggest_int(self, name: str, low: int, high: int, step: int = 1,
                    log: bool = False) -> int:
        value = self.values.get(name)
        if isinstance(value, int) and low <= value <= high and (value - low) % step == 0:
            return value
        if log:
            return min(high, max(low, round(math.exp(self.rng.uniform(math.log(low),
                                                                      math.log(high))))))
        return low + step * self.rng.randint(0, (high - low) // step)

    def suggest_float(self, name: str, low: float, high: float, step: float | None = None,
                      log: bool = False) -> float:
        value = self.values.get(name)
        if isinstance(value, (int, float)) and low <= value <= high:
            return float(value)
        if step is not None:
            return low + step * self.rng.randint(0, int(round((high - low) / step)))
        if log:
            return math.exp(self.rng.uniform(math.log(low), math.log(high)))
        return self.rng.uniform(low, high)

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        value = self.values.get(name, _MISSING)
        return value if value in choices else self.rng.choice(list(choices))


_MISSING = object()
