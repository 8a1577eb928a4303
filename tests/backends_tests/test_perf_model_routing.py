"""Hot-expert routing skew: uniform routing reproduces the uniform formulas exactly; skew touches
fewer distinct experts and loads the busiest EP rank more, monotonically."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.launch_params import LaunchParams
from backends.perf_model.catalog import CatalogError, load_hardware, load_model
from backends.perf_model.catalog import model_from_config
from backends.perf_model.constants import Efficiency
from backends.perf_model.routing import (
    busiest_rank_experts,
    ep_load_imbalance,
    expected_distinct_experts,
    pick_probabilities,
)
from backends.perf_model.step import Node, target_forward

SKEWS = (0.0, 0.25, 0.5, 1.0, 1.5)


@pytest.mark.parametrize("skew", SKEWS)
def test_pick_probabilities_sum_to_top_k_and_stay_probabilities(skew):
    probs = pick_probabilities(384, 8, skew)
    assert sum(probs) == pytest.approx(8)
    assert all(0.0 <= p <= 1.0 for p in probs)
    assert list(probs) == sorted(probs, reverse=True)


def test_uniform_pick_probabilities_are_top_k_over_experts():
    assert pick_probabilities(128, 8, 0.0) == pytest.approx([8 / 128] * 128)


def test_a_steep_skew_caps_the_hottest_experts_at_one_pick_a_token():
    probs = pick_probabilities(64, 8, 3.0)
    assert probs[0] == 1.0 and probs[1] == 1.0  # Zipf-3 would give the top expert > 1
    assert sum(probs) == pytest.approx(8)


@pytest.mark.parametrize("tokens", [1, 16, 256])
def test_zero_skew_reproduces_the_uniform_formulas_exactly(tokens):
    uniform = 384 * (1 - (1 - 8 / 384) ** tokens)
    assert expected_distinct_experts(384, 8, tokens, 0.0) == uniform
    # the skewed code path at a vanishing skew meets the closed form
    assert expected_distinct_experts(384, 8, tokens, 1e-9) == pytest.approx(uniform, rel=1e-6)
    assert busiest_rank_experts(384, 8, tokens, 8, 1e-9) == pytest.approx(
        busiest_rank_experts(384, 8, tokens, 8, 0.0), rel=1e-6)
    assert ep_load_imbalance(384, 8, 8, 0.0) == 1.0


@pytest.mark.parametrize("tokens", [4, 16, 64, 512])
def test_skew_touches_fewer_distinct_experts_monotonically(tokens):
    touched = [expected_distinct_experts(384, 8, tokens, s) for s in SKEWS]
    assert all(a > b for a, b in zip(touched, touched[1:])), touched
    assert touched[-1] >= 8  # never fewer than one token's top-k


def test_one_token_touches_top_k_experts_whatever_the_skew():
    for s in SKEWS:
        assert expected_distinct_experts(384, 8, 1, s) == pytest.approx(8)


# Skews below the point where the hottest of 384 experts is picked by every token (~1).
UNSATURATED = (0.0, 0.2, 0.4, 0.6, 0.8)


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_skew_raises_the_busiest_ranks_token_load_monotonically(ep):
    assert pick_probabilities(384, 8, UNSATURATED[-1])[0] < 1.0
    loads = [ep_load_imbalance(384, 8, ep, s) for s in UNSATURATED]
    assert loads[0] == 1.0
    assert all(a < b for a, b in zip(loads, loads[1:])), loads


def test_experts_every_token_picks_spread_over_ranks_and_even_the_load_again():
    """Past saturation (skew ~1 for 384 experts, top-8) the hottest experts are each picked
    by every token; dealt round-robin they sit on different ranks, so the imbalance falls back
    toward even. The model says so rather than assuming growth without end."""
    loads = [ep_load_imbalance(384, 8, 8, s) for s in (1.0, 1.5, 4.0)]
    assert pick_probabilities(384, 8, 1.0)[0] == 1.0
    assert loads[0] > loads[1] > loads[2] > 1.0


def test_without_ep_one_rank_holds_all_load_whatever_the_skew():
    assert ep_load_imbalance(384, 8, 1, 1.0) == 1.0
    assert busiest_rank_experts(384, 8, 16, 1, 1.0) == expected_distinct_experts(384, 8, 16, 1.0)


@pytest.mark.parametrize("tokens", [1, 16, 256])
def test_busiest_rank_stays_within_its_share_under_skew(tokens):
    for s in SKEWS:
        busiest = busiest_rank_experts(384, 8, tokens, 8, s)
        assert expected_distinct_experts(384, 8, tokens, s) / 8 - 1e-9 <= busiest <= 384 / 8


def test_skew_in_a_step_streams_fewer_expert_bytes_and_loads_ep_dispatch_more():
    """Kimi K2.6 on the user's node: under TP8 + EP8 + attention-DP at 64 requests, skew
    lowers the weight stream (fewer experts touched) and raises the all-to-all time (the
    busiest rank receives more tokens)."""
    node = Node(load_hardware("rtx-pro-6000-server"), Efficiency())
    uniform = load_model("kimi-k2.6")
    skewed = replace(uniform, routing_skew=1.0)
    lp = LaunchParams(tp_size=8, ep_size=8, enable_dp_attention=True)
    flat = target_forward(node, uniform, lp, 8, 1, 1536.0, use_graph=True)
    hot = target_forward(node, skewed, lp, 8, 1, 1536.0, use_graph=True)
    assert hot.moe.ms < flat.moe.ms
    assert hot.comm.ms > flat.comm.ms
    same = target_forward(node, replace(uniform, routing_skew=0.0), lp, 8, 1, 1536.0, True)
    assert same == flat


def test_routing_skew_is_read_from_a_config_and_must_not_be_negative():
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100,
           "num_attention_heads": 4, "intermediate_size": 128, "moe_intermediate_size": 32,
           "num_experts": 16, "num_experts_per_tok": 2}
    assert model_from_config("tiny-moe", cfg).routing_skew == 0.0
    assert model_from_config("tiny-moe", {**cfg, "routing_skew": 0.7}).routing_skew == 0.7
    with pytest.raises(CatalogError, match="routing_skew"):
        model_from_config("tiny-moe", {**cfg, "routing_skew": -0.1})
