from __future__ import annotations

import warnings
from collections.abc import Callable

import optuna
import pytest

from search_spaces import SearchSpace
from search_spaces import SpaceError
from search_spaces import load_space

SMOKE_CONTEXT = {"gpus": 2, "drafter_block_size": 4}


def sample(space: SearchSpace, context: dict, n: int) -> list[dict]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    out = []
    for _ in range(n):
        trial = study.ask()
        out.append(space.suggest(trial, context))
        study.tell(trial, 0.0)
    return out


def test_param_absent_when_its_condition_is_false() -> None:
    space = load_space("smoke")
    fixed = optuna.trial.FixedTrial({"tp_size": 1, "speculative_algorithm": "none"})
    off = space.suggest(fixed, SMOKE_CONTEXT)
    on = space.suggest(
        optuna.trial.FixedTrial(
            {"tp_size": 2, "speculative_algorithm": "dflash", "speculative_dflash_block_size": 3}
        ),
        SMOKE_CONTEXT,
    )
    assert off == {"tp_size": 1, "dp_size": 2, "speculative_algorithm": "none"}
    assert on == {
        "tp_size": 2,
        "dp_size": 1,
        "speculative_algorithm": "dflash",
        "speculative_dflash_block_size": 3,
    }


def test_suggest_returns_params_in_file_order_with_derived_ones() -> None:
    space = load_space("smoke")
    for params in sample(space, SMOKE_CONTEXT, 20):
        assert list(params) == [n for n in space.param_names if n in params]
        assert params["dp_size"] == SMOKE_CONTEXT["gpus"] // params["tp_size"]


def test_a_sample_replays_through_a_fixed_trial() -> None:
    # The tuner can rebuild a full params dict from a trial's stored (sampled) values.
    space = load_space("pcie8_kimi")
    context = {"gpus": 8, "num_experts": 384, "drafter_block_size": 8, "engine": "sglang",
               "measured": False, "max_concurrency": 256}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(20):
        trial = study.ask()
        params = space.suggest(trial, context)
        study.tell(trial, 0.0)
        assert space.suggest(optuna.trial.FixedTrial(trial.params), context) == params


def test_missing_context_names_are_listed() -> None:
    with pytest.raises(SpaceError, match=r"needs context drafter_block_size \(given: gpus\)"):
        load_space("smoke").suggest(optuna.trial.FixedTrial({}), {"gpus": 2})


def test_dynamic_bounds_hold_over_many_samples(make_space: Callable[..., SearchSpace]) -> None:
    space = make_space(
        """
        name: t
        context: {top: n}
        params:
          a: {type: int, low: 1, high: top}
          b: {type: int, low: a, high: "max(a, top // 2) * 2"}
          c: {type: float, low: "b / 10", high: "b / 5", step: 0.1}
        """
    )
    for p in sample(space, {"top": 20}, 200):
        assert 1 <= p["a"] <= 20
        assert p["a"] <= p["b"] <= max(p["a"], 10) * 2
        assert p["b"] / 10 - 1e-9 <= p["c"] <= p["b"] / 5 + 1e-9


def test_dynamic_high_is_rounded_onto_the_step_grid(
    make_space: Callable[..., SearchSpace],
) -> None:
    space = make_space(
        """
        name: t
        context: {top: n}
        params:
          a: {type: int, low: 0, high: top, step: 4}
        """
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Optuna warns when it has to round high itself
        values = {p["a"] for p in sample(space, {"top": 10}, 50)}
    assert values == {0, 4, 8}


def test_empty_dynamic_range_is_an_error(make_space: Callable[..., SearchSpace]) -> None:
    space = make_space(
        """
        name: t
        context: {top: n}
        params:
          a: {type: int, low: 5, high: top}
        """
    )
    with pytest.raises(SpaceError, match=r"params\.a: low 5 > high 3"):
        space.suggest(optuna.trial.FixedTrial({"a": 5}), {"top": 3})


def test_bound_reading_an_absent_param_is_an_error(make_space: Callable[..., SearchSpace]) -> None:
    space = make_space(
        """
        name: t
        params:
          flag: {type: categorical, choices: [false]}
          a: {type: int, low: 1, high: 4, when: flag}
          b: {type: int, low: 1, high: a}
        """
    )
    with pytest.raises(SpaceError, match=r"params\.b\.high: 'a' reads 'a', which is not set"):
        space.suggest(optuna.trial.FixedTrial({"flag": False, "b": 1}), {})


CONSTRAINED = """
    name: t
    params:
      algo: {type: categorical, choices: [none, ddtree]}
      budget: {type: int, low: 1, high: 16, when: "algo == 'ddtree'"}
      depth: {type: int, low: 1, high: 8, when: "budget > 4"}
    constraints:
      - "budget >= 4"
      - {expr: "depth <= budget", when: "algo == 'ddtree'"}
      - {expr: "depth == 1", when: "budget > 8"}
"""


@pytest.mark.parametrize(
    "params, broken",
    [
        ({"algo": "none"}, []),  # reads only absent params: every constraint holds
        ({"algo": "ddtree", "budget": 2}, ["budget >= 4"]),
        ({"algo": "ddtree", "budget": 6, "depth": 7}, ["depth <= budget"]),
        ({"algo": "ddtree", "budget": 12, "depth": 2}, ["depth == 1"]),
        ({"algo": "ddtree", "budget": 4}, []),
    ],
)
def test_constraint_when_and_absent_params(
    make_space: Callable[..., SearchSpace], params: dict, broken: list[str]
) -> None:
    assert make_space(CONSTRAINED).violations(params, {}) == broken


def test_when_reading_an_absent_param_is_false(make_space: Callable[..., SearchSpace]) -> None:
    space = make_space(CONSTRAINED)
    params = space.suggest(optuna.trial.FixedTrial({"algo": "none"}), {})
    assert params == {"algo": "none"}  # `depth` reads the absent `budget`: not sampled


def test_context_only_constraints_empty_the_grid(make_space: Callable[..., SearchSpace]) -> None:
    space = make_space(
        """
        name: t
        context: {gpus: n}
        params:
          a: {type: categorical, choices: [1, 2]}
        constraints: ["gpus % 2 == 0"]
        """
    )
    assert list(space.grid({"gpus": 3})) == []
    assert space.violations({"a": 1}, {"gpus": 3}) == ["gpus % 2 == 0"]
    assert len(list(space.grid({"gpus": 4}))) == 2
