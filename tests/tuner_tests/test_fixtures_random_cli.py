"""`dflash-tune fixtures random` writes a loadable random target + drafter pair (real CLI)."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import cli

from dflash_core import SamplingParams, Spec, build_engine, load_models
from dflash_core.models.random_checkpoint import write_random_pair


@pytest.mark.parametrize("arch", ["qwen3", "qwen3-moe"])
def test_random_fixtures_load_and_generate_and_depend_on_the_seed(tmp_path, arch):
    outputs = []
    for seed in (0, 1):
        run = cli("fixtures", "random", "--arch", arch, "--out", str(tmp_path / str(seed)),
                  "--seed", str(seed), cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        outputs.append(_draft(*run.stdout.split(), arch))
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


def test_unknown_arch_is_one_line(tmp_path):
    run = cli("fixtures", "random", "--arch", "llama", "--out", str(tmp_path), cwd=tmp_path)
    assert run.returncode != 0 and "unknown arch 'llama'" in run.stderr
    assert "Traceback" not in run.stderr
