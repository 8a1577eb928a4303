"""`dflash-tune fixtures random --arch qwen3|qwen3-moe|deepseek-v3` (real subprocess) writes a
loadable random target + drafter pair; deepseek-v3 is a tiny Kimi-shaped target with INT4
experts in a sharded HF layout."""

from __future__ import annotations

import json

import pytest
import torch
from cli_helpers import cli

from dflash_core import SamplingParams, Spec, build_engine, load_models
from dflash_core.models.int4 import Int4Experts
from dflash_core.models.random_checkpoint import ARCHS, write_random_pair


def test_every_random_arch_is_offered():
    assert set(ARCHS) == {"qwen3", "qwen3-moe", "deepseek-v3"}


@pytest.mark.parametrize("arch", ["qwen3", "qwen3-moe"])
def test_random_fixtures_load_and_generate_and_depend_on_the_seed(tmp_path, arch):
    outputs = []
    for seed in (0, 1):
        run = cli("fixtures", "random", "--arch", arch, "--out", str(tmp_path / str(seed)),
                  "--seed", str(seed), cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        manifest = json.loads(run.stdout)
        assert (manifest["arch"], manifest["seed"]) == (arch, seed)
        outputs.append(_draft(manifest["target"], manifest["drafter"], arch))
    outputs.append(_draft(*write_random_pair(arch, tmp_path / "again", 0), arch))
    assert outputs[0] == outputs[2] != outputs[1]
    assert (tmp_path / "0" / "target" / "tokenizer.json").is_file()


def _draft(target_dir, drafter_dir, arch: str) -> list[list[int]]:
    target, drafter = load_models(target_dir, drafter_dir)
    assert (target.config.num_experts > 0) == (arch == "qwen3-moe")
    engine = build_engine(target, drafter, max_batch=1, max_context=32, max_tree_nodes=8)
    with torch.inference_mode():
        return engine.generate([[1, 2, 3]], SamplingParams(max_tokens=6),
                               Spec.dflash(drafter.config.block_size)).tokens


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
    assert (out / "target" / "tokenizer.json").is_file()
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
    run = cli("fixtures", "random", "--arch", "deepseek-v3", "--out", str(out), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    run = cli("generate", "--target", str(out / "target"), "--drafter", str(out / "drafter"),
              "--prompt-ids", "1,2,3,4", "--method", "ddtree", "--budget", "8",
              "--max-tokens", "12", "--compare", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "tokens identical: True" in run.stderr


def test_fixtures_random_refuses_an_unknown_architecture_in_one_line(tmp_path):
    run = cli("fixtures", "random", "--arch", "llama", "--out", str(tmp_path / "x"), cwd=tmp_path)
    assert run.returncode != 0 and run.stdout == ""
    assert "unknown arch 'llama'" in run.stderr and "deepseek-v3" in run.stderr
    assert "Traceback" not in run.stderr
