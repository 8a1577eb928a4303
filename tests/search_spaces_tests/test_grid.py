from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from search_spaces import SearchSpace
from search_spaces import SpaceError
from search_spaces import load_space

MEM_GRID = [0.8, 0.82, 0.84, 0.86, 0.88, 0.9, 0.92]  # exact: no 0.8200000000000001


def one_param(make_space: Callable[..., SearchSpace], spec: str, max_points: int) -> list:
    space = make_space(f"name: t\nparams:\n  a: {spec}\n")
    return [p["a"] for p in space.grid({}, max_points_per_param=max_points)]


@pytest.mark.parametrize(
    "spec, max_points, expected",
    [
        ("{type: categorical, choices: [x, true, 3, 0.5]}", 2, ["x", True, 3, 0.5]),
        ("{type: int, low: 3, high: 7}", 8, [3, 4, 5, 6, 7]),
        ("{type: int, low: 0, high: 8}", 5, [0, 2, 4, 6, 8]),
        ("{type: int, low: 0, high: 10, step: 4}", 8, [0, 4, 8]),
        ("{type: int, low: 0, high: 40, step: 4}", 3, [0, 20, 40]),
        ("{type: int, low: 1, high: 128, log: true}", 8, [1, 2, 4, 8, 16, 32, 64, 128]),
        ("{type: int, low: 1, high: 10, log: true}", 8, [1, 2, 3, 4, 5, 7, 10]),  # deduplicated
        ("{type: float, low: 0.80, high: 0.92, step: 0.02}", 8, MEM_GRID),
        ("{type: float, low: 0.80, high: 0.92, step: 0.02}", 3, [0.8, 0.86, 0.92]),
        ("{type: float, low: 0.80, high: 0.93, step: 0.02}", 8, MEM_GRID),  # high on the grid
        ("{type: float, low: 0, high: 1}", 3, [0.0, 0.5, 1.0]),
        ("{type: float, low: 1, high: 100, log: true}", 3, [1.0, 10.0, 100.0]),
        ("{type: float, low: 2, high: 2}", 8, [2.0]),
        ("{derive: 3}", 2, [3]),
    ],
)
def test_discretization(
    make_space: Callable[..., SearchSpace], spec: str, max_points: int, expected: list
) -> None:
    assert one_param(make_space, spec, max_points) == expected


def test_spread_keeps_both_ends_and_the_limit(make_space: Callable[..., SearchSpace]) -> None:
    for n in range(2, 12):
        values = one_param(make_space, "{type: int, low: 7, high: 300}", n)
        assert values[0] == 7 and values[-1] == 300
        assert len(values) == n and values == sorted(set(values))


def test_smoke_grid_has_the_hand_counted_points() -> None:
    space = load_space("smoke")
    # tp_size 1 or 2, dp_size = gpus // tp_size; speculative none, or dflash x block 2..4.
    assert len(list(space.grid({"gpus": 2, "drafter_block_size": 4}))) == 2 * (1 + 3)
    # gpus=3: tp 2 gives dp 1 and 2 * 1 != 3, so only tp 1 is left.
    points = list(space.grid({"gpus": 3, "drafter_block_size": 4}))
    assert len(points) == 1 + 3
    assert {p["tp_size"] for p in points} == {1}
    assert points[0] == {"tp_size": 1, "dp_size": 3, "speculative_algorithm": "none"}


def test_grid_respects_when_and_dynamic_bounds(make_space: Callable[..., SearchSpace]) -> None:
    space = make_space(
        """
        name: t
        params:
          algo: {type: categorical, choices: [none, tree]}
          block: {type: int, low: 2, high: 4, when: "algo != 'none'"}
          depth: {type: int, low: 1, high: "block - 1", when: "algo == 'tree'"}
        """
    )
    points = list(space.grid({}))
    assert points[0] == {"algo": "none"}
    assert sorted((p["block"], p["depth"]) for p in points[1:]) == [
        (2, 1), (3, 1), (3, 2), (4, 1), (4, 2), (4, 3)
    ]


def test_grid_is_a_lazy_generator() -> None:
    space = load_space("pcie8_kimi")
    context = {"gpus": 8, "num_experts": 384, "drafter_block_size": 8, "engine": "sglang",
               "measured": False, "max_concurrency": 256}
    points = space.grid(context)  # millions of points at the default 8 per param
    assert inspect.isgenerator(points)
    assert space.violations(next(points), context) == []


def test_grid_needs_two_points_per_param() -> None:
    with pytest.raises(SpaceError, match="max_points_per_param must be >= 2"):
        next(load_space("smoke").grid({"gpus": 2, "drafter_block_size": 4}, 1))
