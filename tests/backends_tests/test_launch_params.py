"""LaunchParams: the one parse of a trial's parameters, valid by construction, and the one
mapping of the speculation knobs onto the engine's Spec."""

from __future__ import annotations

import pytest

from backends.launch_params import (MEASURED_ONLY, InvalidParams, LaunchParams,
                                    min_ddtree_budget, to_spec)

DDTREE = {"tp_size": 1, "speculative_algorithm": "ddtree", "speculative_dflash_block_size": 6,
          "speculative_ddtree_budget": 12, "speculative_ddtree_topk": 3,
          "speculative_ddtree_max_depth": 4}


@pytest.mark.parametrize("params, message", [
    ({"tp_size": 8, "enable_magic": True}, "unknown parameter.*enable_magic"),
    ({"tp_size": 8, "ep_size": 3}, "ep_size 3 must divide tp_size 8"),
    ({"tp_size": "8"}, "wrongly typed.*tp_size='8'"),
    ({"cuda_graph": "yes"}, "wrongly typed.*cuda_graph"),
    ({"mem_fraction_static": 1.2}, r"mem_fraction_static must be in \(0, 1\)"),
    ({"speculative_algorithm": "medusa"}, "speculative_algorithm must be one of"),
    ({**DDTREE, "speculative_ddtree_budget": 4}, "budget must be >= block size - 1"),
    ({"max_running_requests": 0}, "max_running_requests must be >= 1"),
    ({"cuda_graph_max_bs": 10**9}, "cuda_graph_max_bs must be at most 65536, got 1000000000"),
    ({**DDTREE, "speculative_ddtree_round_tokens": 0}, "_round_tokens must be >= 1, or leave"),
    ({**DDTREE, "speculative_ddtree_topk": 0}, "_topk must be >= 1, or leave it out"),
    ({**DDTREE, "speculative_ddtree_max_depth": 6}, "_max_depth must be at most block_size - 1"),
    ({"cuda_graph_bs": [1, 0]}, r"cuda_graph_bs must be batch sizes in 1\.\.65536"),
    ({"decode_context_parallel_size": 3}, "decode_context_parallel_size 3 must divide tp_size"),
    ({"nccl_proto": "ll128"}, "nccl_proto must be one of"),
    ({"nccl_p2p_level": "DISABLE"}, "nccl_p2p_level must be one of"),
    ({"cudagraph_mode": "FULL"}, "cudagraph_mode must be one of"),
    ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype must be one of"),
    ({"cudagraph_mode": "PIECEWISE", "cuda_graph": False}, "cudagraph_mode=PIECEWISE needs"),
])
def test_what_no_engine_can_launch_never_parses(params, message):
    with pytest.raises(InvalidParams, match=message):
        LaunchParams.from_params(params)


def test_a_launch_params_is_valid_by_construction():
    with pytest.raises(InvalidParams, match="ep_size"):
        LaunchParams(tp_size=8, ep_size=3)


def test_the_budget_rule_is_the_one_the_spaces_sample_from():
    lp = LaunchParams.from_params({**DDTREE, "speculative_ddtree_budget": min_ddtree_budget(6)})
    assert lp.speculative_ddtree_budget == 5


def test_ddtree_knobs_reach_the_engine_spec_under_their_own_names():
    spec = to_spec(LaunchParams.from_params(DDTREE), trained_block=8)
    assert (spec.method, spec.block_size, spec.budget, spec.topk, spec.max_depth) == (
        "ddtree", 6, 12, 3, 4)


def test_a_round_cap_reaches_the_spec_and_shrinks_the_tree_as_the_engine_does():
    lp = LaunchParams.from_params({**DDTREE, "speculative_ddtree_round_tokens": 32})
    spec = to_spec(lp, trained_block=8)
    assert spec.round_tokens == 32 and "r32" in lp.label()
    for batch in (1, 2, 4, 8):
        step = lp.at_batch(batch)
        assert step.speculative_ddtree_budget == spec.at_rows(batch).budget
        assert step.verify_tokens == spec.at_rows(batch).num_nodes
    assert lp.at_batch(4).speculative_ddtree_budget == 7 and lp.at_batch(8).verify_tokens == 6
    uncapped = LaunchParams.from_params(DDTREE)
    assert uncapped.at_batch(8) is uncapped and not uncapped.round_label


def test_no_depth_cap_is_the_block_and_no_width_cap_the_budget():
    lp = LaunchParams(tp_size=1, speculative_algorithm="ddtree",
                      speculative_dflash_block_size=4, speculative_ddtree_budget=8)
    spec = to_spec(lp, trained_block=8)
    assert (lp.tree_width, lp.tree_depth) == (spec.tree_width, spec.tree_depth) == (8, 3)
    assert "k8 d3" in lp.label()


def test_explicit_capture_sizes_replace_the_ladder_and_parse_from_a_list():
    lp = LaunchParams.from_params({"tp_size": 1, "cuda_graph_bs": [8, 2, 4, 2]})
    assert lp.cuda_graph_bs == (8, 2, 4, 2) and lp.capture_batch_sizes == (2, 4, 8)
    assert LaunchParams(tp_size=1, cuda_graph=False, cuda_graph_bs=(2,)).capture_batch_sizes == ()


def test_plain_decoding_needs_no_drafter_and_speculation_does():
    assert to_spec(LaunchParams(tp_size=1), trained_block=None).method == "none"
    with pytest.raises(ValueError, match="needs a drafter"):
        to_spec(LaunchParams(tp_size=1, speculative_algorithm="dflash"), trained_block=None)


def test_the_pcie_knobs_default_to_what_a_plain_launch_does():
    plain = LaunchParams()
    assert (plain.disable_custom_all_reduce, plain.nccl_proto, plain.nccl_p2p_level,
            plain.decode_context_parallel_size, plain.cudagraph_mode) == (
        False, None, None, 1, "FULL_AND_PIECEWISE")
    assert plain.non_default() == {}


def test_the_model_prices_measured_only_knobs_at_their_defaults():
    lp = LaunchParams(tp_size=4, dp_size=2, nccl_proto="LL128", nccl_p2p_level="LOC",
                      disable_custom_all_reduce=True, decode_context_parallel_size=2,
                      cudagraph_mode="PIECEWISE")
    assert set(lp.non_default()) - {"tp_size", "dp_size"} == MEASURED_ONLY | {
        "decode_context_parallel_size"}  # priced: its KV split and collectives are modelled
    assert lp.priced() == LaunchParams(tp_size=4, dp_size=2, decode_context_parallel_size=2)
    assert "DCP2" in lp.label() and lp.label().endswith(
        "no-custom-ar NCCL_PROTO=LL128 NCCL_P2P_LEVEL=LOC")


def test_an_8_bit_kv_cache_is_priced_and_named():
    lp = LaunchParams(kv_cache_dtype="fp8_e4m3")
    assert lp.priced() == lp and lp.non_default() == {"kv_cache_dtype": "fp8_e4m3"}
    assert lp.label().endswith(" kv-fp8_e4m3") and "kv-" not in LaunchParams().label()
