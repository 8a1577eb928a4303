"""Declarative search spaces: YAML files of parameters, conditions and constraints.

    space = load_space("pcie8_kimi", known_params=LAUNCH_PARAM_NAMES)
    params = space.suggest(trial, context)          # flat dict, derived values included
    if space.violations(params, context): ...       # reject before anything launches
    for params in space.grid(context): ...          # exhaustive, constraint-satisfying

See ``search_spaces/pcie8_kimi.yaml`` for the file format.
"""

from __future__ import annotations

from search_spaces.errors import SpaceError
from search_spaces.expr import Expr
from search_spaces.expr import compile_expr
from search_spaces.loader import list_spaces
from search_spaces.loader import load_space
from search_spaces.params import CategoricalParam
from search_spaces.params import DerivedParam
from search_spaces.params import FloatParam
from search_spaces.params import IntParam
from search_spaces.params import Param
from search_spaces.schema import space_from_dict
from search_spaces.space import Constraint
from search_spaces.space import SearchSpace

__all__ = [
    "CategoricalParam",
    "Constraint",
    "DerivedParam",
    "Expr",
    "FloatParam",
    "IntParam",
    "Param",
    "SearchSpace",
    "SpaceError",
    "compile_expr",
    "list_spaces",
    "load_space",
    "space_from_dict",
]
