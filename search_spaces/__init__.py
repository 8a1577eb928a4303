"""Declarative search spaces: YAML files of parameters, conditions and constraints.

    space = load_space("pcie8_kimi", known_params=LAUNCH_PARAM_NAMES)
    params = space.suggest(trial, context)          # flat dict, derived values included
    if space.violations(params, context): ...       # reject before anything launches
    for params in space.grid(context): ...          # exhaustive, constraint-satisfying

File format (``search_spaces/pcie8_kimi.yaml`` is a full example)::

    name: my_space
    description: free text
    context: {gpus: what it means}      # names the caller passes in; values are not in the file
    params:                             # processed in file order
      tp_size: {type: categorical, choices: [4, 8]}        # ints, floats, strings, booleans
      dp_size: {derive: "gpus // tp_size"}                 # computed, never sampled
      block: {type: int, low: 2, high: 8, step: 2, when: "tp_size == 8"}
      budget: {type: int, low: "block - 1", high: 128, log: true, when: "tp_size == 8"}
      mem: {type: float, low: 0.80, high: 0.92, step: 0.02}   # or log: true, not both
    constraints:
      - "tp_size * dp_size == gpus"
      - {expr: "budget >= block - 1", when: "tp_size == 8"}

``low``, ``high``, ``derive`` and ``when`` are expressions (see ``expr.py`` for the grammar)
over context names and *earlier* params. A param whose ``when`` is false is left out of the
dict. A ``when`` that reads an absent param is false; a constraint that reads one holds; a bound
or ``derive`` that reads one is an error (see ``space.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Names -> the module that defines them, imported on first use: ``search_spaces.unique_yaml``
# (read by the tuner's config loader) must not pull in Optuna through this package.
_EXPORTS = {
    "CategoricalParam": "params", "Constraint": "constraint", "DerivedParam": "params",
    "Expr": "expr", "FloatParam": "params", "IntParam": "params", "Param": "params",
    "SearchSpace": "space", "SpaceError": "errors", "compile_expr": "expr",
    "list_spaces": "loader", "load_space": "loader", "space_from_dict": "schema",
}
__all__ = ["CategoricalParam", "Constraint", "DerivedParam", "Expr", "FloatParam", "IntParam",
           "Param", "SearchSpace", "SpaceError", "compile_expr", "list_spaces", "load_space",
           "space_from_dict"]

if TYPE_CHECKING:  # what static tools see
    from search_spaces.constraint import Constraint
    from search_spaces.errors import SpaceError
    from search_spaces.expr import Expr, compile_expr
    from search_spaces.loader import list_spaces, load_space
    from search_spaces.params import CategoricalParam, DerivedParam, FloatParam, IntParam, Param
    from search_spaces.schema import space_from_dict
    from search_spaces.space import SearchSpace


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'search_spaces' has no attribute {name!r}")
    return getattr(importlib.import_module(f"search_spaces.{_EXPORTS[name]}"), name)
