"""One knob, one name, one meaning, every layer: each speculation knob (block, budget, top-k,
max depth, round cap) walked from a sampled trial through the performance model, the rendered
`dflash-tune serve` command, the options the real serve command parses from it, and the
engine's Spec; the model and the engine must price and run the same tree (node count, width,
depth), "no cap" included."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
import typer

from backends import Deployment, DrafterSpec, Workload
from backends.dflash_server.cli import SERVE_KNOBS, serve
from backends.flags import LaunchTarget, render_command
from backends.launch_cli import ENGINE_DEFAULTS, engine_launch
from backends.launch_params import LaunchParams, to_spec
from backends.perf_model import PerfModelBackend
from dflash_core.speculation.tree import build_tree
from search_spaces import load_space
from tuner.params import parse

KNOBS = ("speculative_algorithm", "speculative_dflash_block_size", "speculative_ddtree_budget",
         "speculative_ddtree_topk", "speculative_ddtree_max_depth",
         "speculative_ddtree_round_tokens")
TRAINED_BLOCK = 8
VOCAB = 64  # wider than any sampled top-k: the lattice, not the vocabulary, bounds a tree
MODEL = PerfModelBackend(Deployment(
    gpu="h200-sxm", gpus=1, model="qwen3-8b", engine="dflash",
    target=LaunchTarget("pair/target", "pair/drafter"),
    drafter=DrafterSpec(block_size=TRAINED_BLOCK, num_layers=1, target_layers=(1,),
                        acceptance=(0.8, 0.7, 0.6))))


@pytest.fixture(scope="module")
def walks() -> list[dict]:
    """DDTree trials sampled from the shipped space, each also with its caps lifted ("no cap")
    and with a depth cap inside its block: every knob at a set and an unset value."""
    space, rng = load_space("tiny_pair"), random.Random(0)
    context = {"gpus": 1, "drafter_block_size": TRAINED_BLOCK}
    found = [space.sample(context, rng, {"speculative_algorithm": "ddtree"}) for _ in range(40)]
    sampled = [p for p in found if not space.violations(p, context)]
    lifted = [{**p, "speculative_ddtree_topk": None, "speculative_ddtree_round_tokens": None}
              for p in sampled]
    capped = [{**p, "speculative_ddtree_max_depth": rng.randint(
        1, p["speculative_dflash_block_size"] - 1)} for p in sampled]
    return sampled + lifted + capped


def _served(launch: LaunchParams) -> LaunchParams:
    """What `dflash-tune serve` runs from the command the tuner renders for ``launch``: the
    real command's parser, then the launch assembled as its body does."""
    app = typer.Typer()
    app.command()(serve)
    argv = render_command("dflash", launch, LaunchTarget("pair/target", "pair/drafter"))
    parsed = typer.main.get_command(app).make_context("serve", argv[2:]).params
    given = {k: v for k, v in parsed.items() if k in SERVE_KNOBS and v is not None}
    return engine_launch({**ENGINE_DEFAULTS, **given}, drafter=None)


def _model_tree(launch: LaunchParams):
    return MODEL.setup(launch, Workload(32, 32, (1,))).acceptance


def test_every_speculation_knob_reaches_the_engine_under_one_name(walks):
    assert len(walks) >= 30
    assert None in {p["speculative_ddtree_round_tokens"] for p in walks}
    for params in walks:
        launch, why = parse(params)  # the one parse, where a sample enters the tuner
        assert launch is not None, why
        assert {k: getattr(launch, k) for k in KNOBS if k in params} == {
            k: params[k] for k in KNOBS if k in params}
        served = _served(launch)
        for spec in (to_spec(launch, TRAINED_BLOCK), to_spec(served, TRAINED_BLOCK)):
            assert (spec.method, spec.block_size, spec.budget, spec.round_tokens) == (
                "ddtree", params["speculative_dflash_block_size"],
                params["speculative_ddtree_budget"], params["speculative_ddtree_round_tokens"])
            assert (spec.tree_width, spec.tree_depth, spec.num_nodes) == (
                launch.tree_width, launch.tree_depth, launch.verify_tokens)


def test_the_model_prices_the_tree_the_engine_builds(walks):
    logits = torch.randn(1, TRAINED_BLOCK - 1, VOCAB, generator=torch.Generator().manual_seed(0))
    for params in walks:
        launch, _ = parse(params)
        for rows in (1, 4, 16):  # a round cap shrinks the tree with the load, in both
            step = launch.at_batch(rows)
            spec = to_spec(launch, TRAINED_BLOCK).at_rows(rows)
            priced = _model_tree(step)
            assert spec.num_nodes == step.verify_tokens
            assert len(priced.hist) - 1 == spec.tree_depth == step.tree_depth
            block = spec.block_size
            tree = build_tree(torch.tensor([0]), logits[:, :block - 1], spec.budget,
                              spec.tree_width, spec.tree_depth, spec.spine)
            assert int(tree.valid.sum()) - 1 == priced.nodes, params
            assert int(tree.depths.max()) <= spec.tree_depth


def test_no_cap_is_the_widest_and_deepest_tree_in_the_model_and_the_engine():
    lifted = LaunchParams(tp_size=1, speculative_algorithm="ddtree",
                          speculative_dflash_block_size=6, speculative_ddtree_budget=12)
    spec = to_spec(lifted, TRAINED_BLOCK)
    assert (lifted.tree_width, lifted.tree_depth) == (spec.tree_width, spec.tree_depth) == (12, 5)
    narrow = replace(lifted, speculative_ddtree_topk=1, speculative_ddtree_max_depth=2)
    assert _model_tree(narrow).nodes == 2 < _model_tree(lifted).nodes == 12
    assert _model_tree(narrow).mean < _model_tree(lifted).mean
    for wrong in ({"speculative_ddtree_topk": 0}, {"speculative_ddtree_max_depth": 0},
                  {"speculative_ddtree_round_tokens": 0}, {"speculative_ddtree_max_depth": 6}):
        with pytest.raises(ValueError, match="speculative_ddtree_"):
            replace(lifted, **wrong)
