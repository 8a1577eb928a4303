"""The shipped space for the user's node, checked against hand-written Python rules."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import fields
from itertools import product
from typing import Any

import optuna
import pytest

from backends.launch_params import LaunchParams
from search_spaces import SearchSpace
from backends.launch_params import min_ddtree_budget
from search_spaces import load_space
from test_space import sample

# A study on the model (the collective knobs stay at their defaults) for SGLang.
CONTEXT = {"gpus": 8, "num_experts": 384, "drafter_block_size": 8, "engine": "sglang",
           "measured": False, "max_concurrency": 256}
COLLECTIVES = {"disable_custom_all_reduce": [False, True],
               "nccl_proto": [None, "LL", "LL128", "Simple"],
               "nccl_p2p_level": [None, "LOC", "SYS"]}
KNOWN = {f.name for f in fields(LaunchParams)}
RUNNING_CHOICES = [16, 32, 48, 64, 128, 256]


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    return load_space("pcie8_kimi", known_params=KNOWN)


@pytest.fixture(scope="module")
def samples(space: SearchSpace) -> list[dict[str, Any]]:
    return sample(space, CONTEXT, 200)


def expected_violations(p: dict[str, Any]) -> list[str]:
    """The file's constraints, in file order, written out in plain Python."""
    graphs, speculative = p["cuda_graph"], p["speculative_algorithm"] != "none"
    rules = [
        ("tp_size * dp_size == gpus", p["tp_size"] * p["dp_size"] == 8),
        ("num_experts % ep_size == 0", 384 % p["ep_size"] == 0),
        ("ep_size <= tp_size", p["ep_size"] <= p["tp_size"]),
        ("tp_size % ep_size == 0", p["tp_size"] % p["ep_size"] == 0),
        ("tp_size % decode_context_parallel_size == 0",
         p["tp_size"] % p.get("decode_context_parallel_size", 1) == 0),
        (
            "cuda_graph_max_bs <= max_running_requests",
            not graphs or p["cuda_graph_max_bs"] <= p["max_running_requests"],
        ),
        (
            "cuda_graph_max_bs >= min(max_concurrency, max_running_requests)",
            not graphs or p["cuda_graph_max_bs"] >= min(256, p["max_running_requests"]),
        ),
        ("tp_size == gpus", not p["enable_dp_attention"] or p["tp_size"] == 8),
        ("not enable_dp_attention", not (speculative and p["enable_dp_attention"])),
        ("cudagraph_mode != 'FULL_AND_PIECEWISE'",
         not speculative or p.get("cudagraph_mode") != "FULL_AND_PIECEWISE"),
        ("drafter_block_size >= 2", True),  # CONTEXT has a block-8 drafter
    ]
    return [source for source, ok in rules if not ok]


def test_sampled_values_stay_in_their_ranges(samples: list[dict[str, Any]]) -> None:
    for p in samples:
        assert set(p) <= KNOWN
        assert p["tp_size"] in (4, 8) and p["ep_size"] in (1, 4, 8)
        assert p["dp_size"] == 8 // p["tp_size"]
        assert p["max_running_requests"] in RUNNING_CHOICES
        assert 0.80 - 1e-9 <= p["mem_fraction_static"] <= 0.92 + 1e-9
        steps = (p["mem_fraction_static"] - 0.80) / 0.02
        assert abs(steps - round(steps)) < 1e-6
        if "speculative_dflash_block_size" in p:
            block = p["speculative_dflash_block_size"]
            assert 2 <= block <= 8
        if "speculative_ddtree_budget" in p:
            assert min_ddtree_budget(block) <= p["speculative_ddtree_budget"] <= 128
            assert 1 <= p["speculative_ddtree_topk"] <= 8
            assert "speculative_ddtree_max_depth" not in p  # SGLang cannot express it
        if "cuda_graph_max_bs" in p:
            assert p["cuda_graph_max_bs"] == p["max_running_requests"]  # derived
            assert p["cuda_graph_bs_ladder"] in ("pow2", "dense")


def test_conditional_params_present_exactly_when_enabled(samples: list[dict[str, Any]]) -> None:
    for p in samples:
        speculative = p["speculative_algorithm"] != "none"
        ddtree = p["speculative_algorithm"] == "ddtree"
        assert ("speculative_dflash_block_size" in p) == speculative
        for name in ("budget", "topk"):
            assert (f"speculative_ddtree_{name}" in p) == ddtree
        assert ("cuda_graph_max_bs" in p) == p["cuda_graph"]
        assert ("cuda_graph_bs_ladder" in p) == p["cuda_graph"]
    assert {p["speculative_algorithm"] for p in samples} == {"none", "dflash", "ddtree"}


def test_violations_match_the_constraints(
    space: SearchSpace, samples: list[dict[str, Any]]
) -> None:
    for p in samples:
        assert space.violations(p, CONTEXT) == expected_violations(p)
    feasible = [p for p in samples if not expected_violations(p)]
    assert 0 < len(feasible) < len(samples)  # both outcomes exercised


def test_launch_params_accept_every_feasible_sample(
    space: SearchSpace, samples: list[dict[str, Any]]
) -> None:
    feasible = [p for p in samples if not space.violations(p, CONTEXT)]
    assert any(p["speculative_algorithm"] == "ddtree" for p in feasible)
    for p in feasible:
        LaunchParams.from_params(p)


def three_points(low: int, high: int, log: bool = False) -> list[int]:
    """What grid(max_points_per_param=3) should give for an int range."""
    if high - low + 1 <= 3:
        return list(range(low, high + 1))
    middle = round(math.sqrt(low * high)) if log else low + round((high - low) / 2)
    return [low, middle, high]


def speculative_options(algorithm: str) -> list[dict[str, Any]]:
    if algorithm == "none":
        return [{}]
    blocks = three_points(2, 8)
    if algorithm == "dflash":
        return [{"speculative_dflash_block_size": b} for b in blocks]
    return [
        {
            "speculative_dflash_block_size": b,
            "speculative_ddtree_budget": budget,
            "speculative_ddtree_topk": topk,
        }
        for b in blocks
        for budget in three_points(b - 1, 128, log=True)
        for topk in three_points(1, 8)
    ]


def brute_force_grid() -> list[dict[str, Any]]:
    points = []
    for tp, ep, attention, algorithm, graphs, running, mem in product(
        [4, 8], [1, 4, 8], [False, True], ["none", "dflash", "ddtree"], [True, False],
        RUNNING_CHOICES, [0.80, 0.86, 0.92],
    ):  # fmt: skip
        graph_options = (
            [{"cuda_graph_max_bs": bs, "cuda_graph_bs_ladder": ladder}
             for bs in [running] for ladder in ("pow2", "dense")]
            if graphs else [{}]
        )  # fmt: skip
        for spec, graph in product(speculative_options(algorithm), graph_options):
            p = {
                "tp_size": tp, "dp_size": 8 // tp, "ep_size": ep,
                "enable_dp_attention": attention, "speculative_algorithm": algorithm, **spec,
                "cuda_graph": graphs, **graph, "max_running_requests": running,
                "mem_fraction_static": mem,
            }  # fmt: skip
            if not expected_violations(p):
                points.append(p)
    return points


def test_grid_equals_a_brute_force_enumeration(space: SearchSpace) -> None:
    grid = list(space.grid(CONTEXT, max_points_per_param=3))
    expected = brute_force_grid()
    assert len(grid) == len(expected) == 8_532

    names = space.param_names

    def row(p: dict[str, Any]) -> tuple[Any, ...]:  # a dict as a hashable row, "-" if absent
        return tuple(p.get(n, "-") for n in names)

    name_set = set(names)
    assert all(p.keys() <= name_set for p in grid)
    assert Counter(map(row, grid)) == Counter(map(row, expected))
    for p in grid[::97]:
        LaunchParams.from_params(p)


def test_grid_with_two_points_per_param_matches_the_hand_count(space: SearchSpace) -> None:
    # Layouts: TP8 x EP{1,4,8} x attention-DP {off,on} = 6, TP4 x EP{1,4} = 2 -> 8.
    # Speculation: none 1 + dflash block {2,8} 2 + ddtree (block 2: budget {1,128} x topk {1,8}
    #   = 4; block 8: budget {7,128} x topk {1,8} = 4) = 11; the 3 attention-DP layouts take
    #   none only -> 5 x 11 + 3 x 1 = 58.
    # Graphs x running cap: graphs off 6 caps; on: each cap (max_bs = cap) x 2 ladders = 12
    #   -> 18. Memory {0.80, 0.92} -> 2.
    count = sum(1 for _ in space.grid(CONTEXT, max_points_per_param=2))
    assert count == 58 * 18 * 2


def test_without_a_drafter_speculation_is_rejected_not_crashed(space: SearchSpace) -> None:
    context = {**CONTEXT, "drafter_block_size": 1}  # what the tuner passes with no drafter
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(30):
        trial = study.ask()
        p = space.suggest(trial, context)
        study.tell(trial, 0.0)
        assert "speculative_dflash_block_size" not in p
        speculative = p["speculative_algorithm"] != "none"
        assert ("drafter_block_size >= 2" in space.violations(p, context)) == speculative
    grid = space.grid(context, max_points_per_param=2)
    assert {p["speculative_algorithm"] for p in grid} == {"none"}


def test_a_real_engine_study_asks_about_the_collectives_and_the_model_never(
    space: SearchSpace, samples: list[dict[str, Any]]
) -> None:
    assert not any(set(COLLECTIVES) & set(p) for p in samples)  # model: engine defaults
    measured = sample(space, {**CONTEXT, "measured": True}, 200)
    for name, choices in COLLECTIVES.items():
        assert {p[name] for p in measured} == set(choices)
    vllm_only = ("decode_context_parallel_size", "cudagraph_mode")
    assert not any(set(vllm_only) & set(p) for p in measured)  # SGLang has neither


def test_a_vllm_study_asks_about_context_parallel_and_the_graph_mode(space: SearchSpace) -> None:
    context = {**CONTEXT, "engine": "vllm", "measured": True}
    for p in sample(space, context, 200):
        assert p["decode_context_parallel_size"] in (1, 2, 4, 8)
        assert ("cudagraph_mode" in p) == p["cuda_graph"]
        if p["tp_size"] % p["decode_context_parallel_size"]:
            assert "tp_size % decode_context_parallel_size == 0" in space.violations(p, context)
        elif not space.violations(p, context):
            LaunchParams.from_params(p)
    # The model prices context parallelism, not the graph mode: a model study asks only the first.
    model = sample(space, {**CONTEXT, "engine": "vllm"}, 200)
    assert {p["decode_context_parallel_size"] for p in model} == {1, 2, 4, 8}
    assert not any("cudagraph_mode" in p for p in model)


def test_graphs_must_cover_the_highest_level_measured(space: SearchSpace) -> None:
    rule = "cuda_graph_max_bs >= min(max_concurrency, max_running_requests)"
    p = {"tp_size": 8, "dp_size": 1, "ep_size": 1, "enable_dp_attention": False,
         "speculative_algorithm": "dflash", "speculative_dflash_block_size": 4,
         "cuda_graph": True, "max_running_requests": 128, "cuda_graph_max_bs": 64,
         "cuda_graph_bs_ladder": "pow2", "mem_fraction_static": 0.88}
    assert rule in space.violations(p, CONTEXT)  # 128 requests x 4 tokens, graphs for 64
    assert rule not in space.violations(p, {**CONTEXT, "max_concurrency": 64})
    assert rule not in space.violations({**p, "cuda_graph_max_bs": 128}, CONTEXT)


def test_the_collectives_multiply_a_measured_grid_by_their_choices(space: SearchSpace) -> None:
    measured = {**CONTEXT, "measured": True}
    count = sum(1 for _ in space.grid(measured, max_points_per_param=2))
    assert count == 58 * 18 * 2 * math.prod(map(len, COLLECTIVES.values()))
