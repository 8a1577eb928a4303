from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

import search_spaces
from search_spaces import SearchSpace
from search_spaces import SpaceError
from search_spaces import list_spaces
from search_spaces import load_space

GOOD_PARAM = "a: {type: int, low: 1, high: 4}"


@pytest.mark.parametrize(
    "params, message",
    [
        ("a: {type: foo}", "params.a.type: unknown type 'foo'; expected int, float, categorical"),
        ("a: {low: 1, high: 2}", "params.a.type: missing `type`"),
        ("a: {type: int, low: 5, high: 3}", "params.a: low 5 > high 3"),
        ("a: {type: float, low: 0.9, high: 0.8}", "params.a: low 0.9 > high 0.8"),
        ("a: {type: int, low: '2 * 3', high: 5}", "params.a: low 6 > high 5"),
        ("a: {type: categorical, choices: []}", "params.a.choices: must not be empty"),
        ("a: {type: categorical, choices: [1, true]}", "params.a.choices: duplicate choices"),
        ("a: {type: int, low: 1, high: 8, step: 2, log: true}", "params.a: `step` and `log`"),
        ("a: {type: float, low: 1, high: 8, step: 0.5, log: true}", "params.a: `step` and `log`"),
        ("a: {type: float, low: 0, high: 8, log: true}", "params.a: log scale needs low > 0"),
        ("a: {type: float, low: 0, high: 1, step: 0}", "params.a.step: must be > 0"),
        ("a: {type: int, low: 1, high: 4, stpe: 2}", "params.a.stpe: unknown key (allowed: type"),
        ("a: {type: int, low: 1.5, high: 4}", "params.a.low: must be an integer or an expression"),
        ("a: {type: int, low: true, high: 4}", "params.a.low: must be an integer"),
        ("a: {type: int, low: 1, high: 4, log: 'yes'}", "params.a.log: Input should be a valid"),
        ("a: {type: int, high: 4}", "params.a.low: Field required"),
        ("a: {type: int, low: 1, high: 4, derive: 2}", "params.a: `derive` and `type` exclude"),
        ("a: {derive: 2, low: 1}", "params.a.low: unknown key (allowed: derive, when)"),
        ("a: 3", "params.a: Input should be a valid dictionary"),
        ("2x: {derive: 1}", "params.2x: '2x' is not a valid name"),
        ("class: {derive: 1}", "params.class: 'class' is not a valid name"),
        ("min: {derive: 1}", "params.min: 'min' is already a function or context name"),
        ("gpus: {derive: 1}", "params.gpus: 'gpus' is already a function or context name"),
        (
            "a: {type: int, low: b, high: 4}\n  b: {derive: 1}",
            "params.a.low: 'b' in 'b' is not defined yet: expressions read only earlier params",
        ),
        ("a: {type: int, low: 1, high: 4, when: 'a > 1'}", "params.a.when: 'a' in 'a > 1' is"),
        (
            "b: {derive: 1}\n  a: {type: int, low: 1, high: 'b + nope'}",
            "params.a.high: 'nope' in 'b + nope' is unknown; available here: gpus, b",
        ),
        ("a: {derive: 'gpus.real'}", "params.a.derive: attribute access is not allowed"),
        ("a: {derive: 'gpus.bit_length()'}", "params.a.derive: calling gpus.bit_length (only"),
        ("a: {derive: '__import__(\"os\")'}", "params.a.derive: calling '__import__'"),
        ("a: {derive: 'x[0]'}", "params.a.derive: a subscript is not allowed"),
        ("a: {derive: 1, when: 'lambda: 1'}", "params.a.when: a lambda is not allowed"),
    ],
)
def test_param_errors_name_file_and_path(
    space_file: Callable[[str], Path], params: str, message: str
) -> None:
    path = space_file(f"name: t\ncontext: {{gpus: n}}\nparams:\n  {params}\n")
    with pytest.raises(SpaceError) as info:
        load_space(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


@pytest.mark.parametrize(
    "constraints, message",
    [
        ("['a > nope']", "constraints[0]: 'nope' in 'a > nope' is unknown; available here: a"),
        ("['a > 1', 'a.real']", "constraints[1]: attribute access is not allowed"),
        ("[{expr: 'a > 1', whne: a}]", "constraints[0].whne: unknown key (allowed: expr, when)"),
        ("[{when: 'a > 1'}]", "constraints[0].expr: Field required"),
        ("[{expr: 'a > 1', when: 'b'}]", "constraints[0].when: 'b' in 'b' is unknown"),
        ("[3]", "constraints[0]: must be an expression or {expr:, when:}"),
    ],
)
def test_constraint_errors_name_file_and_path(
    space_file: Callable[[str], Path], constraints: str, message: str
) -> None:
    path = space_file(f"name: t\nparams:\n  {GOOD_PARAM}\nconstraints: {constraints}\n")
    with pytest.raises(SpaceError, match=re.escape(message)):
        load_space(path)


@pytest.mark.parametrize(
    "text, message",
    [
        (f"params:\n  {GOOD_PARAM}\n", "name: Field required"),
        (f"name: t\nparms:\n  {GOOD_PARAM}\n", "parms: unknown key (allowed: name, description"),
        ("- just a list\n", "the document must be a mapping"),
        ("name: t\nparams: {a: [\n", "invalid YAML"),
        (f"name: t\nparams:\n  {GOOD_PARAM}\n  {GOOD_PARAM}\n", "params.a: duplicate key (line 4)"),
        ("name: t\ncontext: {2x: n}\nparams: {a: {derive: 1}}\n", "context.2x: '2x' is not a"),
        ("name: t\nparams: {on: {derive: 1}}\n", "params: True is not a string (YAML reads yes"),
    ],
)
def test_document_errors(space_file: Callable[[str], Path], text: str, message: str) -> None:
    with pytest.raises(SpaceError, match=re.escape(message)):
        load_space(space_file(text))


def test_every_pydantic_problem_gets_its_own_line(space_file: Callable[[str], Path]) -> None:
    path = space_file("name: t\nparams:\n  a: {type: int, low: x.y, hgh: 4, lg: true}\n")
    with pytest.raises(SpaceError) as info:
        load_space(path)
    lines = str(info.value).splitlines()
    assert sorted(line.split(": ")[1] for line in lines) == [
        "params.a.hgh",
        "params.a.high",
        "params.a.lg",
    ]
    assert all(line.startswith(f"{path}: ") for line in lines)


def test_known_params_catch_a_typo_with_a_hint(space_file: Callable[[str], Path]) -> None:
    path = space_file("name: t\nparams:\n  tp_sise: {type: categorical, choices: [4, 8]}\n")
    with pytest.raises(SpaceError, match=r"params\.tp_sise: unknown parameter .* 'tp_size'\?"):
        load_space(path, known_params={"tp_size", "dp_size"})
    assert load_space(path).param_names == ("tp_sise",)  # no check without known_params


def test_shipped_spaces_load_by_name_or_path() -> None:
    assert {"pcie8_kimi", "smoke"} <= set(list_spaces())
    by_name = load_space("smoke")
    by_path = load_space(str(Path(by_name.source)))
    assert isinstance(by_name, SearchSpace)
    assert by_name == by_path
    assert by_name.name == "smoke"


def test_unknown_shipped_name_lists_the_shipped_ones() -> None:
    with pytest.raises(SpaceError, match=r"no_such: no such shipped space; shipped: .*smoke"):
        load_space("no_such")


def test_missing_file_is_a_space_error(tmp_path: Path) -> None:
    with pytest.raises(SpaceError, match=r"missing\.yaml: cannot read"):
        load_space(tmp_path / "missing.yaml")


def test_the_format_example_in_the_package_docstring_loads() -> None:
    doc = search_spaces.__doc__
    example = textwrap.dedent(doc[doc.index("::") + 2 : doc.index("``low``")])
    space = search_spaces.space_from_dict(yaml.safe_load(example), "docstring")
    assert space.param_names == ("tp_size", "dp_size", "block", "budget", "mem")
    assert all(not space.violations(p, {"gpus": 8}) for p in space.grid({"gpus": 8}))


def test_the_tuners_yaml_reader_loads_no_optuna():
    """tuner.yaml is read with this package's unique-key loader; `best` must not pay for
    Optuna to read it."""
    import subprocess
    import sys

    code = ("import sys, tuner.config_file, search_spaces.unique_yaml; "
            "assert 'optuna' not in sys.modules; from search_spaces import load_space")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
