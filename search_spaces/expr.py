"""A small, safe expression language for search spaces: Python syntax over a whitelist.

Allowed: numbers, strings, ``True``/``False``/``None``, names, ``+ - * / // % **``, unary ``-``
``+`` and ``not``, ``and``/``or``, comparisons (chained, and ``in``/``not in`` a tuple or list
literal), ``a if c else b`` and calls to ``min``, ``max`` and ``abs``. Anything else is rejected
when the expression is compiled, i.e. when the space is loaded. Nothing is ever passed to
``eval``: the syntax tree is turned into nested closures once, then called per evaluation.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from search_spaces.errors import SpaceError

Env = Mapping[str, Any]
Fn = Callable[[Env], Any]

FUNCTIONS: dict[str, tuple[Callable[..., Any], int, int | None]] = {
    # name: (function, min args, max args); min/max of one argument would need an iterable.
    "min": (min, 2, None),
    "max": (max, 2, None),
    "abs": (abs, 1, 1),
}
_CONSTANT_TYPES = (bool, int, float, str, type(None))
_MAX_DEPTH = 100  # nested nodes; a real constraint has a handful
_MAX_POW_BITS = 4096  # `9 ** 9 ** 9` would hang the process; no search space needs such numbers


def _pow(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int) and b > 0 and a.bit_length() * b > _MAX_POW_BITS:
        raise ValueError("power too large")
    result = a**b
    if isinstance(result, complex):  # (-8) ** 0.5
        raise ValueError("complex result")
    return result


_ARITH: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _pow,
}
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
}
# Friendlier names for the nodes people are most likely to try.
_NODE_NAMES = {
    ast.Attribute: "attribute access",
    ast.Subscript: "a subscript",
    ast.Lambda: "a lambda",
    ast.Tuple: "a tuple outside `in`",
    ast.List: "a list outside `in`",
    ast.JoinedStr: "an f-string",
    ast.NamedExpr: "`:=`",
}


class UnsetName(Exception):
    """An expression read a parameter that is absent (its `when` was false)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


@dataclass(slots=True, frozen=True)
class Expr:
    """A compiled expression; ``names`` are the free names it reads."""

    source: str
    where: str  # "file: params.x.low", prefixed to every evaluation error
    names: frozenset[str]
    fn: Fn = field(repr=False, compare=False)

    def evaluate(self, env: Env) -> Any:
        """The value of the expression; an absent name is an error here."""
        try:
            return self._run(env)
        except UnsetName as e:
            raise SpaceError(
                f"{self.where}: {self.source!r} reads {e.name!r}, which is not set "
                "(its `when` was false)"
            ) from None

    def holds(self, env: Env, *, if_unset: bool) -> bool:
        """Truth of the expression; ``if_unset`` when it reads an absent parameter."""
        try:
            return bool(self._run(env))
        except UnsetName:
            return if_unset

    def _run(self, env: Env) -> Any:
        try:
            return self.fn(env)
        except (ArithmeticError, TypeError, ValueError, RecursionError) as e:
            raise SpaceError(f"{self.where}: cannot evaluate {self.source!r}: {e}") from e


def compile_expr(source: str | int | float, where: str) -> Expr:
    """Parse and check ``source``; a number becomes a constant expression."""
    text = source if isinstance(source, str) else repr(source)
    names: set[str] = set()
    short = text if len(text) <= 80 else text[:77] + "..."
    try:
        tree = ast.parse(text.strip(), mode="eval").body
        _check_depth(tree, short)
        fn = _build(tree, names)
    except SyntaxError as e:
        raise SpaceError(f"{where}: invalid expression {short!r}: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:  # null bytes, absurd nesting
        raise SpaceError(f"{where}: invalid expression {short!r}: {e!r}") from None
    except _Rejected as e:
        raise SpaceError(f"{where}: {e} is not allowed in expressions ({short!r})") from None
    return Expr(text, where, frozenset(names), fn)


class _Rejected(Exception):
    pass


def _check_depth(tree: ast.AST, short: str) -> None:
    """A ValueError past _MAX_DEPTH nested nodes. Checked here, without recursion, because the
    interpreter's recursion limit is not ours to rely on: torch's compiler raises it in-process,
    and `-` * 600 + `1` would then build (and evaluate) instead of being refused."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise ValueError(f"nested deeper than {_MAX_DEPTH} levels")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _build(node: ast.AST, names: set[str]) -> Fn:
    builder = _BUILDERS.get(type(node))
    if builder is None:
        raise _Rejected(_NODE_NAMES.get(type(node), type(node).__name__))
    return builder(node, names)


def _constant(node: ast.Constant, names: set[str]) -> Fn:
    if not isinstance(node.value, _CONSTANT_TYPES):
        raise _Rejected(f"constant {node.value!r}")
    value = node.value
    return lambda env: value


def _name(node: ast.Name, names: set[str]) -> Fn:
    key = node.id
    if key.startswith("__"):
        raise _Rejected(f"name {key!r}")
    if key in FUNCTIONS:
        raise _Rejected(f"{key!r} without a call")
    names.add(key)

    def lookup(env: Env) -> Any:
        if key not in env:
            raise UnsetName(key)
        return env[key]

    return lookup


def _binop(node: ast.BinOp, names: set[str]) -> Fn:
    op = _ARITH.get(type(node.op))
    if op is None:
        raise _Rejected(f"operator {type(node.op).__name__}")
    left, right = _build(node.left, names), _build(node.right, names)
    return lambda env: op(_number(left(env)), _number(right(env)))


def _number(value: Any) -> int | float:
    # Arithmetic on strings would allow `'x' * 10**9` and %-formatting; no space needs it.
    if not isinstance(value, (int, float)):
        raise TypeError(f"arithmetic on {type(value).__name__} {value!r}")
    return value


def _unary(node: ast.UnaryOp, names: set[str]) -> Fn:
    op = _UNARY.get(type(node.op))
    if op is None:
        raise _Rejected(f"operator {type(node.op).__name__}")
    operand = _build(node.operand, names)
    if isinstance(node.op, ast.Not):
        return lambda env: op(operand(env))
    return lambda env: op(_number(operand(env)))


def _boolop(node: ast.BoolOp, names: set[str]) -> Fn:
    fns = [_build(v, names) for v in node.values]
    stop_on = not isinstance(node.op, ast.And)  # `and` stops at the first falsy value

    def run(env: Env) -> Any:
        # Short-circuit like Python, so `algo == 'ddtree' and budget > 8` never reads an
        # absent `budget`.
        for fn in fns:
            value = fn(env)
            if bool(value) == stop_on:
                return value
        return value

    return run


def _compare(node: ast.Compare, names: set[str]) -> Fn:
    ops = [_COMPARE.get(type(op)) for op in node.ops]
    if None in ops:  # `is` / `is not`: identity of numbers is an implementation detail
        raise _Rejected("`is`")
    first = _build(node.left, names)
    rest = [_operand(c, op, names) for c, op in zip(node.comparators, node.ops)]

    def run(env: Env) -> bool:
        left = first(env)
        for op, fn in zip(ops, rest):
            right = fn(env)
            if not op(left, right):
                return False
            left = right
        return True

    return run


def _operand(node: ast.expr, op: ast.cmpop, names: set[str]) -> Fn:
    if not isinstance(op, (ast.In, ast.NotIn)):
        return _build(node, names)
    if not isinstance(node, (ast.Tuple, ast.List)):
        raise _Rejected("`in` with anything but a tuple or list literal")
    items = [_build(e, names) for e in node.elts]
    return lambda env: tuple(fn(env) for fn in items)


def _ifexp(node: ast.IfExp, names: set[str]) -> Fn:
    test, body, orelse = (_build(n, names) for n in (node.test, node.body, node.orelse))
    return lambda env: body(env) if test(env) else orelse(env)


def _call(node: ast.Call, names: set[str]) -> Fn:
    func = node.func.id if isinstance(node.func, ast.Name) else None
    if func not in FUNCTIONS:
        label = repr(func) if func else ast.unparse(node.func)
        raise _Rejected(f"calling {label} (only {', '.join(FUNCTIONS)})")
    fn, low, high = FUNCTIONS[func]
    if node.keywords or not low <= len(node.args) <= (high or len(node.args)):
        raise _Rejected(f"this call of {func}() (takes {low}{'' if high else '+'} arguments)")
    args = [_build(a, names) for a in node.args]
    return lambda env: fn(*(_number(a(env)) for a in args))


_BUILDERS: dict[type, Callable[[Any, set[str]], Fn]] = {
    ast.Constant: _constant,
    ast.Name: _name,
    ast.BinOp: _binop,
    ast.UnaryOp: _unary,
    ast.BoolOp: _boolop,
    ast.Compare: _compare,
    ast.IfExp: _ifexp,
    ast.Call: _call,
}
