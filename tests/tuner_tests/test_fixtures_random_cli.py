"""`dflash-tune fixtures random --arch deepseek-v3` (real subprocess): a tiny random Kimi-shaped
target with INT4 experts in a sharded HF layout, and a drafter the engine pairs with it."""

from __future__ import annotations

import json

from cli_helpers import cli

from dflash_core import SamplingParams, Spec, build_engine, load_models
from dflash_core.models.int4 import Int4Experts


def test_fixtures_random_deepseek_writes_a_loadable_kimi_shaped_pair(tmp_path):
    out = tmp_path / "kimi"
    run = cli("fixtures", "random", "--arch", "deepseek-v3", "--out", str(out), "--seed", "3",
              cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    manifest = json.loads(run.stdout)
    assert manifest["target"] == str(out / "target") and manifest["seed"] == 3
    config = json.loads((out / "target" / "config.json").read_text())
    assert config["model_type"] == "deepseek_v3" and config["n_group"] == 1
    assert config["quantization_config"]["format"] == "pack-quantized"
    assert (out / "target" / "model.safetensors.index.json").is_file()
    target, drafter = load_models(out / "target", out / "drafter")
    assert isinstance(target.model.layers[1].mlp.experts, Int4Experts)
    yarn = target.config.rope_scaling  # the drafter: the same YaRN frequencies, plain Qwen3 scale
    assert (drafter.config.layers.rope_scaling.factor,
            drafter.config.layers.rope_scaling.original_max_position_embeddings) == (
        yarn.factor, yarn.original_max_position_embeddings)
    engine = build_engine(target, drafter, max_batch=2, max_context=48, max_tree_nodes=16)
    prompts, sampling = [[1, 2, 3], [9, 8, 7, 6, 5]], SamplingParams(max_tokens=8)
    plain = engine.generate(prompts, sampling, Spec.none()).tokens
    assert engine.generate(prompts, sampling, Spec.ddtree(8, 8)).tokens == plain


def test_generate_runs_the_random_deepseek_pair_losslessly(tmp_path):
    out = tmp_path / "kimi"
    assert cli("fixtures", "random", "--out", str(out), cwd=tmp_path).returncode == 0
    run = cli("generate", "--target", str(out / "target"), "--drafter", str(out / "drafter"),
              "--prompt-ids", "1,2,3,4", "--method", "ddtree", "--budget", "8",
              "--max-tokens", "12", "--compare", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "tokens identical: True" in run.stderr


def test_fixtures_random_refuses_an_unknown_architecture(tmp_path):
    run = cli("fixtures", "random", "--arch", "llama", "--out", str(tmp_path / "x"), cwd=tmp_path)
    assert run.returncode != 0
    assert "deepseek-v3" in run.stderr and run.stdout == ""
