"""`dflash-tune generate` on checkpoints saved in the public layouts (real subprocess)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from cli_helpers import cli

sys.path.insert(0, str(Path(__file__).parents[1] / "dflash_core_tests"))
from core_helpers import make_drafter, make_engine, make_target

from dflash_core import SamplingParams, Spec, save_model

PROMPTS = [[1, 2, 3], [4, 5]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    save_model(make_target(), root / "target")
    save_model(make_drafter(), root / "drafter")
    return root


def test_generate_prints_the_engine_tokens_and_the_acceptance_table(checkpoints, tmp_path):
    run = cli("generate", "--target", str(checkpoints / "target"), "--drafter",
              str(checkpoints / "drafter"), "--prompt-ids", "1,2,3", "--prompt-ids", "4 5",
              "--method", "ddtree", "--budget", "8", "--spine", "--max-tokens", "12",
              "--compare", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    expected = make_engine(make_target()).generate(PROMPTS, SamplingParams(max_tokens=12),
                                                   Spec.none()).tokens
    assert run.stdout.splitlines() == [" ".join(map(str, t)) for t in expected]
    assert "mean accept" in run.stderr and "tokens identical: True" in run.stderr


@pytest.mark.parametrize("args, message", [
    (["--method", "dflash"], "needs a drafter"),
    (["--prompt", "hello"], "tokenizer"),
    (["--prompt-ids", "1,x"], "integers"),
])
def test_generate_errors_are_one_line(checkpoints, tmp_path, args, message):
    base = ["generate", "--target", str(checkpoints / "target")]
    if "--prompt" not in args and "--prompt-ids" not in args:
        base += ["--prompt-ids", "1,2"]
    run = cli(*base, *args, cwd=tmp_path)
    assert run.returncode != 0 and message in run.stderr
    assert "Traceback" not in run.stderr


def test_generate_refuses_a_missing_checkpoint(tmp_path):
    run = cli("generate", "--target", str(tmp_path / "nope"), "--prompt-ids", "1", cwd=tmp_path)
    assert run.returncode == 2 and "config.json not found" in run.stderr


def test_generate_refuses_a_checkpoint_config_field_of_the_wrong_type(checkpoints, tmp_path):
    target = tmp_path / "target"
    shutil.copytree(checkpoints / "target", target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "hidden_size": "big"}))
    run = cli("generate", "--target", str(target), "--prompt-ids", "1,2", cwd=tmp_path)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "hidden_size must be an integer, got 'big'" in run.stderr


@pytest.mark.parametrize("args, message", [
    # Before the check, this tree grew the process past 8 GB before anything was said.
    (["--budget", "100000"], ("speculative_ddtree_budget 100000 is past the largest tree the "
                              "engine verifies, 1024 nodes")),
    (["--budget", "16", "--max-tokens", "1000000000"],
     "GB are free: lower speculative_ddtree_budget, the running requests"),
])
def test_generate_refuses_a_tree_or_context_the_engine_cannot_allocate(checkpoints, tmp_path,
                                                                      args, message):
    run = cli("generate", "--target", str(checkpoints / "target"), "--drafter",
              str(checkpoints / "drafter"), "--prompt-ids", "1,2,3", "--method", "ddtree", *args,
              cwd=tmp_path, timeout=60)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert message in run.stderr



def _damaged_target(checkpoints: Path, folder: Path, name: str, content: str) -> Path:
    target = folder / "target"
    shutil.copytree(checkpoints / "target", target)
    (target / name).write_text(content)
    return target


@pytest.mark.parametrize("name, content, args, says", [
    ("tokenizer.json", "not a tokenizer at all", ["--prompt", "hello"],
     "tokenizer.json is not a tokenizer the `tokenizers` package reads ("),
    ("tokenizer.json", '{"model": 3}', ["--prompt", "hello"],
     "tokenizer.json is not a tokenizer the `tokenizers` package reads ("),
    ("config.json", "[1, 2]", ["--prompt-ids", "1,2"],
     "config.json must hold a JSON object of config fields, not a list"),
    ("config.json", "{truncated", ["--prompt-ids", "1,2"], "config.json is not valid JSON"),
])
def test_generate_refuses_a_checkpoint_file_it_cannot_read_in_one_line(checkpoints, tmp_path,
                                                                       name, content, args,
                                                                       says):
    target = _damaged_target(checkpoints, tmp_path, name, content)
    run = cli("generate", "--target", str(target), *args, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    [line] = run.stderr.strip().splitlines()
    assert line.startswith(f"error: {target}/{says}")
