"""YAML document -> SearchSpace.

Pydantic checks the shape of each entry (unknown keys, types); then names and expressions are
checked in file order and everything becomes frozen dataclasses. Every error names the source
file and the path inside it, one ``file: path: message`` line per problem.
"""

from __future__ import annotations

import difflib
import keyword
from collections.abc import Callable
from collections.abc import Collection
from dataclasses import dataclass
from typing import Annotated
from typing import Any
from typing import Literal

from pydantic import AfterValidator
from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import StrictBool
from pydantic import StrictInt
from pydantic import StrictStr
from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from search_spaces.errors import SpaceError
from search_spaces.expr import FUNCTIONS
from search_spaces.expr import Expr
from search_spaces.expr import compile_expr
from search_spaces.params import CategoricalParam
from search_spaces.params import DerivedParam
from search_spaces.params import FloatParam
from search_spaces.params import IntParam
from search_spaces.params import Param
from search_spaces.constraint import Constraint
from search_spaces.space import SearchSpace


def _accept(*types: type, what: str, positive: bool = False) -> AfterValidator:
    def check(value: Any) -> Any:
        # bool is an int to Python, but `low: true` is a typo, not the number 1.
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise PydanticCustomError("type", f"must be {what}")
        if positive and value <= 0:
            raise PydanticCustomError("value", f"must be > 0, got {value}")
        return value

    return AfterValidator(check)


IntBound = Annotated[Any, _accept(int, str, what="an integer or an expression string")]
FloatBound = Annotated[Any, _accept(int, float, str, what="a number or an expression string")]
FloatStep = Annotated[Any, _accept(int, float, what="a number", positive=True)]
Choice = Annotated[Any, _accept(bool, int, float, str, what="a number, string or boolean")]
# A categorical may also offer null: the knob left unset ("no cap" for the DDTree caps).
CategoricalChoice = Annotated[Any, _accept(bool, int, float, str, type(None),
                                           what="a number, string, boolean or null")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _IntModel(_Model):
    type: Literal["int"]
    low: IntBound
    high: IntBound
    step: StrictInt | None = Field(default=None, ge=1)
    log: StrictBool = False
    when: StrictStr | None = None


class _FloatModel(_Model):
    type: Literal["float"]
    low: FloatBound
    high: FloatBound
    step: FloatStep | None = None
    log: StrictBool = False
    when: StrictStr | None = None


class _CategoricalModel(_Model):
    type: Literal["categorical"]
    choices: list[CategoricalChoice]
    when: StrictStr | None = None


class _DeriveModel(_Model):
    derive: Choice  # an expression string, or a fixed number / boolean
    when: StrictStr | None = None


class _ConstraintModel(_Model):
    expr: StrictStr
    when: StrictStr | None = None


class _SpaceModel(_Model):
    name: StrictStr
    description: StrictStr = ""
    context: dict[str, StrictStr] = {}  # name -> what it means; values come from the caller
    params: dict[str, dict[str, Any]]
    constraints: list[Any] = []


_KEY_MSG = "{key} is not a string (YAML reads yes/no/on/off as booleans: quote such names)"


@dataclass(slots=True)
class _Scope:
    """Names an expression may read at the current point of the file."""

    source: str
    defined: list[str]  # context names, then the params processed so far
    params: list[str]  # every param name, to tell "defined later" from "unknown"

    def compile(self, value: Any, path: str) -> Expr:
        expr = compile_expr(value, f"{self.source}: {path}")
        for name in sorted(expr.names - set(self.defined)):
            if name in self.params:
                why = "is not defined yet: expressions read only earlier params (file order)"
            else:
                available = ", ".join(self.defined) or "none"
                why = f"is unknown; available here: {available} (caller names go in `context:`)"
            raise SpaceError(f"{self.source}: {path}: {name!r} in {value!r} {why}")
        return expr

    def maybe(self, value: str | None, path: str) -> Expr | None:
        return None if value is None else self.compile(value, path)


def space_from_dict(
    data: Any, source: str = "<dict>", known_params: Collection[str] | None = None
) -> SearchSpace:
    """Build a SearchSpace from a parsed YAML document; ``source`` names it in errors."""
    if not isinstance(data, dict):
        raise SpaceError(f"{source}: the document must be a mapping with name, params, ...")
    for section in ("context", "params"):
        mapping = data.get(section)
        for key in mapping if isinstance(mapping, dict) else ():
            if not isinstance(key, str):
                raise SpaceError(f"{source}: {section}: {_KEY_MSG.format(key=repr(key))}")
    doc = _validate(_SpaceModel, data, source, "")
    for name in doc.context:
        _check_name(name, source, f"context.{name}", taken=())
    scope = _Scope(source, list(doc.context), list(doc.params))
    params = []
    known = None if known_params is None else set(known_params)
    for name, raw in doc.params.items():
        _check_name(name, source, f"params.{name}", taken=doc.context, known=known)
        params.append(_param(name, raw, scope))
        scope.defined.append(name)
    constraints = tuple(_constraint(raw, i, scope) for i, raw in enumerate(doc.constraints))
    return SearchSpace(
        doc.name, doc.description, tuple(params), constraints, tuple(doc.context), source
    )


def _param(name: str, raw: dict[str, Any], scope: _Scope) -> Param:
    path = f"params.{name}"
    if "derive" in raw and "type" in raw:
        raise SpaceError(f"{scope.source}: {path}: `derive` and `type` exclude each other")
    kind = "derive" if "derive" in raw else raw.get("type")
    if kind not in _KINDS:
        expected = "int, float, categorical (or `derive: <expr>` without a type)"
        what = f"unknown type {kind!r}" if "type" in raw else "missing `type`"
        raise SpaceError(f"{scope.source}: {path}.type: {what}; expected {expected}")
    model, build = _KINDS[kind]
    param = build(name, _validate(model, raw, scope.source, path), scope, path)
    if isinstance(param, (IntParam, FloatParam)) and not param.low.names | param.high.names:
        param.bounds({})  # static bounds: low > high, log with low <= 0 fail now, not mid-study
    return param


def _int_param(name: str, m: _IntModel, scope: _Scope, path: str) -> IntParam:
    _check_step_log(m, scope.source, path)
    low, high = scope.compile(m.low, f"{path}.low"), scope.compile(m.high, f"{path}.high")
    when = scope.maybe(m.when, f"{path}.when")
    return IntParam(name, low, high, m.step or 1, m.log, when, f"{scope.source}: {path}")


def _float_param(name: str, m: _FloatModel, scope: _Scope, path: str) -> FloatParam:
    _check_step_log(m, scope.source, path)
    low, high = scope.compile(m.low, f"{path}.low"), scope.compile(m.high, f"{path}.high")
    when = scope.maybe(m.when, f"{path}.when")
    return FloatParam(name, low, high, m.step, m.log, when, f"{scope.source}: {path}")


def _categorical_param(
    name: str, m: _CategoricalModel, scope: _Scope, path: str
) -> CategoricalParam:
    if not m.choices:
        raise SpaceError(f"{scope.source}: {path}.choices: must not be empty")
    # By equality, as Optuna looks choices up: 1, 1.0 and True are one choice to it.
    if len(set(m.choices)) < len(m.choices):
        raise SpaceError(f"{scope.source}: {path}.choices: duplicate choices in {m.choices}")
    when = scope.maybe(m.when, f"{path}.when")
    return CategoricalParam(name, tuple(m.choices), when, f"{scope.source}: {path}")


def _derived_param(name: str, m: _DeriveModel, scope: _Scope, path: str) -> DerivedParam:
    expr = scope.compile(m.derive, f"{path}.derive")
    when = scope.maybe(m.when, f"{path}.when")
    return DerivedParam(name, expr, when, f"{scope.source}: {path}")


_KINDS: dict[str | None, tuple[type[_Model], Callable[..., Param]]] = {
    "int": (_IntModel, _int_param),
    "float": (_FloatModel, _float_param),
    "categorical": (_CategoricalModel, _categorical_param),
    "derive": (_DeriveModel, _derived_param),
}


def _constraint(raw: Any, i: int, scope: _Scope) -> Constraint:
    path = f"constraints[{i}]"
    if isinstance(raw, str):
        return Constraint(scope.compile(raw, path))
    if not isinstance(raw, dict):
        raise SpaceError(f"{scope.source}: {path}: must be an expression or {{expr:, when:}}")
    m = _validate(_ConstraintModel, raw, scope.source, path)
    return Constraint(scope.compile(m.expr, f"{path}.expr"), scope.maybe(m.when, f"{path}.when"))


def _check_step_log(m: _IntModel | _FloatModel, source: str, path: str) -> None:
    if m.step is not None and m.log:
        raise SpaceError(f"{source}: {path}: `step` and `log` cannot be combined")


def _check_name(
    name: str, source: str, path: str, taken: Collection[str], known: set[str] | None = None
) -> None:
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("__"):
        raise SpaceError(f"{source}: {path}: {name!r} is not a valid name (use a_name_like_this)")
    if name in FUNCTIONS or name in taken:
        raise SpaceError(f"{source}: {path}: {name!r} is already a function or context name")
    if known is not None and name not in known:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(sorted(known))}"
        raise SpaceError(f"{source}: {path}: unknown parameter {name!r}; {hint}")


def _validate(model: type[_Model], data: Any, source: str, prefix: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        lines = [_error_line(err, model, source, prefix) for err in e.errors()]
        raise SpaceError("\n".join(lines)) from None


def _error_line(err: Any, model: type[_Model], source: str, prefix: str) -> str:
    loc, msg = list(err["loc"]), err["msg"]
    if loc and loc[-1] == "[key]":  # pydantic has turned the key into a loc part by now
        loc, msg = loc[:-2], _KEY_MSG.format(key="a key")
    elif err["type"] == "extra_forbidden" and len(loc) == 1:
        msg = f"unknown key (allowed: {', '.join(model.model_fields)})"
    path = prefix
    for part in loc:
        path += f"[{part}]" if type(part) is int else f"{'.' if path else ''}{part}"
    return f"{source}: {path or 'document'}: {msg}"
