"""One knob, one name, every layer once: the DDTree budget, width (top-k) and round cap walked
from a shipped search space to the engine's Spec, through both ways a configuration reaches our
engine (in process, and rendered as a `dflash-tune serve` command that the real serve command
parses)."""

from __future__ import annotations

import random

import pytest
import typer

from backends.dflash_server.cli import serve
from backends.dflash_server.launch import ServeOptions
from backends.flags import LaunchTarget, render_command
from backends.launch_params import to_spec
from search_spaces import load_space
from tuner.params import parse

KNOBS = ("speculative_algorithm", "speculative_dflash_block_size", "speculative_ddtree_budget",
         "speculative_ddtree_topk", "speculative_ddtree_round_tokens")
TRAINED_BLOCK = 8


@pytest.fixture(scope="module")
def ddtree_samples() -> list[dict]:
    space, rng = load_space("tiny_pair"), random.Random(0)
    context = {"gpus": 1, "drafter_block_size": TRAINED_BLOCK}
    found = [space.sample(context, rng, {"speculative_algorithm": "ddtree"}) for _ in range(40)]
    return [p for p in found if not space.violations(p, context)]


def _served_spec(launch):
    """What `dflash-tune serve` builds from the command the tuner renders for ``launch``."""
    app = typer.Typer()
    app.command()(serve)
    argv = render_command("dflash", launch, LaunchTarget("pair/target", "pair/drafter"))
    parsed = typer.main.get_command(app).make_context("serve", argv[2:]).params
    options = ServeOptions(**{k: v for k, v in parsed.items()
                              if k in ServeOptions.__dataclass_fields__})
    options.speculative_algorithm = parsed["speculative_algorithm"].value
    return to_spec(options, TRAINED_BLOCK)


def test_budget_width_and_round_cap_reach_the_engine_under_one_name(ddtree_samples):
    assert len(ddtree_samples) >= 10
    assert len({p["speculative_ddtree_round_tokens"] for p in ddtree_samples}) > 1
    for params in ddtree_samples:
        launch, why = parse(params)  # the one parse, where a sample enters the tuner
        assert launch is not None, why
        assert {k: getattr(launch, k) for k in KNOBS} == {k: params[k] for k in KNOBS}
        for spec in (to_spec(launch, TRAINED_BLOCK), _served_spec(launch)):
            assert (spec.method, spec.block_size, spec.budget, spec.topk, spec.round_tokens) == (
                "ddtree", params["speculative_dflash_block_size"],
                params["speculative_ddtree_budget"], params["speculative_ddtree_topk"],
                params["speculative_ddtree_round_tokens"])
