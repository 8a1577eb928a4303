"""`dflash-tune generate --tp-size 2 --compare` on the shipped pair (real subprocesses: the CLI
and its rank): it says whether the tokens match single-device plain decoding, and its exit
status says so too. Without --compare, on a random Kimi-shaped DeepSeek target (MLA, INT4
experts) over TP2+EP2, it prints the single-device tokens (its rank 0 reads only the configs)."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import cli

from dflash_core import SamplingParams, Spec, build_engine, load_models
from dflash_core.models.random_checkpoint import write_random_pair
from dflash_core.training.evaluate import held_out_prompts
from dflash_core.training.pair import ensure_pair

PAIR = ensure_pair()
PROMPT = ",".join(map(str, held_out_prompts(PAIR)[0][:20]))


def _generate(tmp_path, *args: str):
    return cli("generate", "--target", str(PAIR / "target"), "--drafter", str(PAIR / "drafter"),
               "--prompt-ids", PROMPT, "--max-tokens", "12", "--tp", "2", "--compare", *args,
               cwd=tmp_path, timeout=180)


@pytest.mark.slow
def test_generate_tp2_compare_matches_single_device_plain_and_fails_when_it_does_not(tmp_path):
    run = _generate(tmp_path, "--method", "ddtree", "--budget", "12")
    assert run.returncode == 0, run.stderr
    assert "none, 1 device" in run.stderr and "tokens identical: True" in run.stderr
    assert "all_reduce" in run.stderr  # the per-round collectives table
    # Sampled DFlash draws differently from sampled plain decoding: a real mismatch.
    differs = _generate(tmp_path, "--method", "dflash", "--temperature", "1.0")
    assert differs.returncode == 1, differs.stderr
    assert "tokens identical: False" in differs.stderr


@pytest.mark.slow
def test_generate_tp2_ep2_on_a_deepseek_target_prints_the_single_device_tokens(tmp_path):
    target, drafter = write_random_pair("deepseek-v3", tmp_path / "kimi", seed=0)
    prompts = [[5, 17, 250, 3, 99], [7, 64]]
    models = load_models(target, drafter)
    with torch.inference_mode():
        expected = build_engine(*models, max_batch=2, max_context=32, max_tree_nodes=16).generate(
            prompts, SamplingParams(max_tokens=10), Spec.none()).tokens
    ids = [",".join(map(str, p)) for p in prompts]
    run = cli("generate", "--target", str(target), "--drafter", str(drafter), "--method",
              "ddtree", "--budget", "12", "--max-tokens", "10", "--tp", "2", "--ep", "2",
              "--prompt-ids", ids[0], "--prompt-ids", ids[1], cwd=tmp_path, timeout=180)
    assert run.returncode == 0, run.stderr
    assert [list(map(int, line.split())) for line in run.stdout.splitlines()] == expected
