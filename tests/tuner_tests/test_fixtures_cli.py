"""`dflash-tune fixtures build` and `generate --prompt` on the shipped pair (real subprocess)."""

from __future__ import annotations

import json
import shutil

from cli_helpers import cli

from dflash_core.training.evaluate import held_out_prompts
from dflash_core.training.pair import ensure_pair
from dflash_core.training.tokenizer import load_tokenizer


def test_fixtures_build_keeps_a_complete_pair_and_prints_its_folder(tmp_path):
    folder = tmp_path / "pair"
    shutil.copytree(ensure_pair(), folder)
    before = (folder / "target" / "model.safetensors").stat().st_mtime_ns
    run = cli("fixtures", "build", "--out", str(folder), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(folder) and "complete" in run.stderr
    assert (folder / "target" / "model.safetensors").stat().st_mtime_ns == before


def test_generate_takes_text_prompts_with_the_pair_tokenizer(tmp_path):
    pair = ensure_pair()
    prompts = [load_tokenizer(pair / "target").decode(p) for p in held_out_prompts(pair)[:2]]
    run = cli("generate", "--target", str(pair / "target"), "--drafter", str(pair / "drafter"),
              "--prompt", prompts[0], "--prompt", prompts[1], "--method", "ddtree",
              "--budget", "16", "--max-tokens", "24", "--compare", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    texts = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(texts) == 2 and all(isinstance(t, str) and t for t in texts)
    assert "tokens identical: True" in run.stderr
