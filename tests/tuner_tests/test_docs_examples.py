"""docs/examples: one tuner.yaml per backend, each valid as shipped (read from the repository
root, where their relative paths point)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from backends import BACKENDS
from backends.flags import render_command
from tuner.config import load_config
from tuner.params import parse
from tuner.wiring import launch_target_from, space_context, space_from

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"
BY_FILE = {"model.yaml": "model", "serve-tiny-pair.yaml": "serve",
           "inprocess-tiny-pair.yaml": "inprocess", "sglang.yaml": "sglang",
           "vllm.yaml": "vllm", "vllm-cpu-tiny-pair.yaml": "vllm",
           "vllm-cpu-calibrate.yaml": "vllm"}
TINY_PAIR = ("serve-tiny-pair.yaml", "inprocess-tiny-pair.yaml", "vllm-cpu-tiny-pair.yaml",
             "vllm-cpu-calibrate.yaml")


def test_every_backend_but_the_simulated_node_has_an_example():
    assert set(BY_FILE.values()) == set(BACKENDS) - {"simulated"}  # a tuner developer's tool
    assert {p.name for p in EXAMPLES.glob("*.yaml")} == {*BY_FILE, "vllm_space.yaml"}


@pytest.mark.parametrize("name", sorted(BY_FILE))
def test_example_config_loads_and_its_space_samples_launchable_flags(name, monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = load_config(EXAMPLES / name)
    assert cfg.backend.name == BY_FILE[name]
    space, context = space_from(cfg), space_context(cfg)
    rng, rendered = random.Random(0), 0
    for _ in range(200):
        params = space.sample(context, rng)
        if space.violations(params, context):
            continue
        launch, why = parse(params)
        assert launch is not None, why
        render_command(cfg.backend.engine, launch, launch_target_from(cfg))  # raises if not
        rendered += 1
    assert rendered >= 20


@pytest.mark.parametrize("name", TINY_PAIR)
def test_tiny_pair_examples_describe_the_shipped_drafter(name, monkeypatch):
    monkeypatch.chdir(REPO)
    d = load_config(EXAMPLES / name).drafter
    shipped = json.loads((REPO / d.path / "config.json").read_text())
    assert (d.block_size, d.num_layers, d.target_layers, d.num_heads, d.num_kv_heads,
            d.head_dim, d.intermediate_size) == (
        shipped["block_size"], shipped["num_hidden_layers"],
        shipped["dflash_config"]["target_layer_ids"], shipped["num_attention_heads"],
        shipped["num_key_value_heads"], shipped["head_dim"], shipped["intermediate_size"])
