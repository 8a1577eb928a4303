"""Golden argv for `dflash-tune serve` (written by hand from tuner/cli.py's serve options)."""

from __future__ import annotations

import pytest

from backends.flags import LaunchTarget, UnsupportedParams, render_command
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


def test_plain_eager_has_no_drafter_or_graph_options():
    params = LaunchParams(tp_size=1, cuda_graph=False, max_running_requests=4)
    assert render_command("dflash", params, LaunchTarget("t", port=9)) == [
        "dflash-tune", "serve", "--target", "t", "--method", "none",
        "--max-running-requests", "4", "--host", "127.0.0.1", "--port", "9"]


@pytest.mark.parametrize("params", [LaunchParams(tp_size=2), LaunchParams(tp_size=1, dp_size=2),
                                    LaunchParams(tp_size=1, enable_dp_attention=True)])
def test_multi_device_layouts_are_unsupported(params):
    with pytest.raises(UnsupportedParams, match="one device"):
        render_command("dflash", params, TARGET)


def test_the_rendered_command_parses_with_the_real_serve_command():
    import typer

    from tuner.cli import app

    params = LaunchParams(tp_size=1, speculative_algorithm="ddtree", max_running_requests=8)
    argv = render_command("dflash", params, TARGET)
    command = typer.main.get_command(app)
    serve = command.commands["serve"]
    context = serve.make_context("serve", argv[2:])
    assert context.params["budget"] == 16 and context.params["cuda_graph_bs"] == "1,2,4,8"
    assert str(context.params["drafter"]) == "pair/drafter"
