from __future__ import annotations

import pytest

from search_spaces import SpaceError
from search_spaces import compile_expr


def evaluate(source: str, **env: object) -> object:
    return compile_expr(source, "t.yaml: x").evaluate(env)


@pytest.mark.parametrize(
    "source, env, expected",
    [
        ("1 + 2 * 3 - 4", {}, 3),
        ("gpus // tp_size", {"gpus": 8, "tp_size": 4}, 2),
        ("7 / 2", {}, 3.5),
        ("-x % 3", {"x": 4}, 2),
        ("2 ** 10", {}, 1024),
        ("1 < x <= 3", {"x": 3}, True),
        ("1 < x <= 3", {"x": 4}, False),
        ("x == 'none' or x != 'dflash'", {"x": "ddtree"}, True),
        ("algo in ('dflash', 'ddtree')", {"algo": "ddtree"}, True),
        ("algo not in ['dflash', 'ddtree']", {"algo": "none"}, True),
        ("a if c else b", {"a": 1, "b": 2, "c": False}, 2),
        ("min(a, 4) + max(1, 2, 3) + abs(-2)", {"a": 9}, 9),
        ("not flag and x == 'none'", {"flag": False, "x": "none"}, True),
        ("True and None", {}, None),
        ("0.8 + 0.02", {}, 0.8 + 0.02),
        ("8", {}, 8),
    ],
)
def test_evaluates_like_python(source: str, env: dict, expected: object) -> None:
    assert evaluate(source, **env) == expected


def test_numbers_compile_as_constants() -> None:
    assert compile_expr(128, "w").evaluate({}) == 128
    assert compile_expr(0.92, "w").evaluate({}) == 0.92


def test_collects_free_names_but_not_functions() -> None:
    expr = compile_expr("a + min(b, 2) if c in (d, 1) else 3", "w")
    assert expr.names == {"a", "b", "c", "d"}


@pytest.mark.parametrize(
    "source",
    [
        "__import__('os')",
        "os.system('true')",
        "x.__class__",
        "x[0]",
        "lambda: 1",
        "open('f')",
        "eval('1')",
        "min",
        "min(1)",
        "abs(1, 2)",
        "max(1, 2, key=abs)",
        "min(*xs)",
        "(1, 2)",
        "[1, 2]",
        "x in y",
        "x is None",
        "f'{x}'",
        "[i for i in x]",
        "{'a': 1}",
        "1j",
        "b'x'",
        "(y := 1)",
        "__debug__",
        "x << 2",
        "~x",
    ],
)
def test_rejects_everything_outside_the_whitelist(source: str) -> None:
    with pytest.raises(SpaceError, match=r"^t\.yaml: x: .* is not allowed in expressions"):
        compile_expr(source, "t.yaml: x")


def test_syntax_error_names_the_location() -> None:
    with pytest.raises(SpaceError, match=r"^t\.yaml: x: invalid expression '1 \+'"):
        compile_expr("1 +", "t.yaml: x")


@pytest.mark.parametrize(
    "source", ["-" * 100_000 + "1", "(" * 10_000 + "1" + ")" * 10_000, "-" * 600 + "1", "1\0"]
)
def test_pathological_input_is_a_space_error(source: str) -> None:
    with pytest.raises(SpaceError, match=r"^t\.yaml: x: invalid expression"):
        compile_expr(source, "t.yaml: x")


@pytest.mark.parametrize(
    "source, env",
    [
        ("1 / x", {"x": 0}),
        ("'a' * 3", {}),
        ("x + 1", {"x": "s"}),
        ("x < 1", {"x": "s"}),
        ("9 ** 9 ** 9", {}),
        ("(-8) ** 0.5", {}),
        ("2.0 ** 10000", {}),
        ("min(1, 'a')", {}),
    ],
)
def test_runtime_errors_are_space_errors(source: str, env: dict) -> None:
    with pytest.raises(SpaceError, match=r"^t\.yaml: x: cannot evaluate"):
        evaluate(source, **env)


def test_reading_an_unset_name_is_an_error_for_values() -> None:
    with pytest.raises(SpaceError, match="reads 'budget', which is not set"):
        evaluate("budget + 1")


def test_holds_reports_unset_names_as_told() -> None:
    expr = compile_expr("budget > 1", "w")
    assert expr.holds({}, if_unset=True) is True
    assert expr.holds({}, if_unset=False) is False
    assert expr.holds({"budget": 0}, if_unset=True) is False


def test_and_or_short_circuit_past_unset_names() -> None:
    expr = compile_expr("algo == 'ddtree' and budget > 8", "w")
    assert expr.evaluate({"algo": "dflash"}) is False
    assert compile_expr("algo == 'none' or budget > 8", "w").evaluate({"algo": "none"}) is True


def test_deep_nesting_is_refused_whatever_the_recursion_limit() -> None:
    """The refusal must not depend on sys.getrecursionlimit(): torch's compiler raises it."""
    import sys

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        with pytest.raises(SpaceError, match=r"nested deeper than"):
            compile_expr("-" * 600 + "1", "t.yaml: x")
    finally:
        sys.setrecursionlimit(old)
    assert compile_expr("-" * 50 + "1", "t.yaml: x").evaluate({}) == 1
