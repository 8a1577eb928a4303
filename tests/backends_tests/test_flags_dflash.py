"""Golden argv for `dflash-tune serve` (written by hand from tuner/cli.py's serve options)."""

from __future__ import annotations

import pytest

from backends.flags import (LaunchTarget, UnsupportedParams, engine_label, render_command,
                            render_env)
from backends.launch_params import LaunchParams

TARGET = LaunchTarget("pair/target", "pair/drafter", port=8001, context_length=512)


def test_ddtree_maps_budget_topk_and_depth_to_the_server_options():
    params = LaunchParams(tp_size=1, speculative_algorithm="ddtree", speculative_ddtree_budget=16,
                          speculative_ddtree_topk=4, speculative_ddtree_max_depth=5,
                          max_running_requests=8, cuda_graph_max_bs=8, cuda_graph_bs_ladder="pow2")
    assert render_command("dflash", params, TARGET) == [
        "dflash-tune", "serve", "--target", "pair/target", "--method", "ddtree",
        "--drafter", "pair/drafter", "--block-size", "8", "--budget", "16", "--width", "4",
        "--depth", "5", "--max-running-requests", "8", "--max-context", "512",
        "--cuda-graph-bs", "1,2,4,8", "--host", "127.0.0.1", "--port", "8001"]


def test_a_round_cap_renders_only_when_set():
    params = LaunchParams(tp_size=1, speculative_algorithm="ddtree", speculative_ddtree_budget=16,
                          speculative_ddtree_round_tokens=64)
    argv = render_command("dflash", params, TARGET)
    assert argv[argv.index("--round-tokens") + 1] == "64"
    assert "--round-tokens" not in render_command(
        "dflash", LaunchParams(tp_size=1, speculative_algorithm="ddtree"), TARGET)
    assert "--round-tokens" not in render_command(  # a dflash chain has no tree to cap
        "dflash", LaunchParams(tp_size=1, speculative_algorithm="dflash",
                               speculative_ddtree_round_tokens=64), TARGET)


def test_plain_eager_has_no_drafter_or_graph_options():
    params = LaunchParams(tp_size=1, cuda_graph=False, max_running_requests=4)
    assert render_command("dflash", params, LaunchTarget("t", port=9)) == [
        "dflash-tune", "serve", "--target", "t", "--method", "none",
        "--max-running-requests", "4", "--host", "127.0.0.1", "--port", "9"]


@pytest.mark.parametrize("params", [LaunchParams(tp_size=2, dp_size=2),
                                    LaunchParams(tp_size=1, dp_size=2),
                                    LaunchParams(tp_size=2, enable_dp_attention=True)])
def test_data_parallel_layouts_are_unsupported(params):
    with pytest.raises(UnsupportedParams, match="no data parallelism"):
        render_command("dflash", params, TARGET)


def test_tensor_and_expert_parallel_layouts_render_their_sizes():
    params = LaunchParams(tp_size=4, ep_size=2, cuda_graph=False, max_running_requests=4)
    argv = render_command("dflash", params, LaunchTarget("t", port=9))
    assert argv[argv.index("--tp-size") + 1] == "4" and argv[argv.index("--ep-size") + 1] == "2"
    assert "--tp-size" not in render_command("dflash", LaunchParams(tp_size=1), TARGET)


def _serve_command(which: str):
    """The click command behind `python -m backends.dflash_server` or `dflash-tune serve`."""
    import typer

    from backends.dflash_server.cli import serve
    from tuner.cli import app

    if which == "dflash-tune serve":
        return typer.main.get_command(app).commands["serve"]
    alone = typer.Typer()
    alone.command()(serve)
    return typer.main.get_command(alone)


@pytest.mark.parametrize("which", ["python -m backends.dflash_server", "dflash-tune serve"])
def test_every_knob_parses_back_under_its_tuning_name(which):
    """The walk of a knob from LaunchParams through the flag table to serve's options: the
    rendered command parses with the real serve command back to the same values, each under
    the LaunchParams field name."""
    params = LaunchParams(tp_size=4, ep_size=2, speculative_algorithm="ddtree",
                          speculative_ddtree_budget=20, speculative_ddtree_topk=3,
                          speculative_ddtree_max_depth=5, speculative_ddtree_round_tokens=64,
                          max_running_requests=8)
    argv = render_command("dflash", params, TARGET)
    parsed = _serve_command(which).make_context("serve", argv[2:]).params
    for knob in ("speculative_dflash_block_size", "speculative_ddtree_budget",
                 "speculative_ddtree_topk", "speculative_ddtree_max_depth",
                 "speculative_ddtree_round_tokens", "max_running_requests", "tp_size",
                 "ep_size"):
        assert parsed[knob] == getattr(params, knob), knob
    assert parsed["speculative_algorithm"] == "ddtree"
    assert parsed["cuda_graph_bs"] == "1,2,4,8" and str(parsed["drafter"]) == "pair/drafter"


@pytest.mark.parametrize("knob", [{"disable_custom_all_reduce": True},
                                  {"decode_context_parallel_size": 2},
                                  {"cudagraph_mode": "PIECEWISE"},
                                  {"kv_cache_dtype": "fp8_e4m3"}])
def test_engine_knobs_serve_has_no_counterpart_for_are_refused_by_name(knob):
    with pytest.raises(UnsupportedParams, match=f"cannot express {next(iter(knob))}="):
        render_command("dflash", LaunchParams(**knob), TARGET)


def test_nccl_knobs_reach_serves_ranks_through_the_environment():
    params = LaunchParams(tp_size=2, nccl_proto="Simple", nccl_p2p_level="LOC")
    assert render_env("dflash", params) == {"NCCL_PROTO": "Simple", "NCCL_P2P_LEVEL": "LOC"}
    assert engine_label("dflash", params).endswith("NCCL_P2P_LEVEL=LOC NCCL_PROTO=Simple")
