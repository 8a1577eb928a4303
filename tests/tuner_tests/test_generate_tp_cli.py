"""`dflash-tune generate --tp-size 2 --compare` on the shipped pair (real subprocesses: the CLI
and its rank): it says whether the tokens match single-device plain decoding, and its exit
status says so too."""

from __future__ import annotations

import pytest
from cli_helpers import cli

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
