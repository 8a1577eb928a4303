"""`dflash-tune fixtures build` and `generate --prompt` on the shipped pair (real subprocess);
builds that are interrupted or cannot write."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import cli

from dflash_core.training.evaluate import held_out_prompts
from dflash_core.training.pair import ensure_pair, is_complete
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


def _build(folder: Path) -> subprocess.Popen:
    """The build as a terminal starts it: SIGINT at its default even where this test runs in
    a background job (which ignores SIGINT, and a child would inherit that)."""
    return subprocess.Popen([sys.executable, "-m", "tuner", "fixtures", "build", "--out",
                             str(folder)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_fixtures_build_off_a_terminal_prints_progress_and_stops_promptly_on_ctrl_c(tmp_path):
    """stderr is a pipe here, as in a log or CI: plain progress lines, then SIGINT during the
    tokenizer's encoding (native code that ran for seconds without seeing Ctrl-C)."""
    folder = tmp_path / "pair"
    proc = _build(folder)
    try:
        first = proc.stderr.readline()  # blocks until the first progress line
        assert first.startswith("tokenizer 1/1"), first + proc.stderr.read()
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
        stopped_s = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 130 and stopped_s < 5, (stopped_s, err)
    assert f"interrupted: {folder} was not (re)built" in err and "Traceback" not in err
    assert not is_complete(folder)


@pytest.mark.parametrize("where", ["read-only folder", "file in the way"])
def test_fixtures_build_into_an_unwritable_folder_fails_before_training(tmp_path, where):
    from unwritable import unwritable_folder

    (tmp_path / "a-file").write_text("x")
    folder = {"read-only folder": lambda: unwritable_folder(tmp_path) / "pair",
              "file in the way": lambda: tmp_path / "a-file" / "pair"}[where]()
    began = time.monotonic()
    run = cli("fixtures", "build", "--out", str(folder), cwd=tmp_path, timeout=90)
    assert run.returncode == 2 and time.monotonic() - began < 60, run.stderr
    assert run.stderr.count("\n") == 1 and f"cannot build into {folder}" in run.stderr
    assert "--out" in run.stderr and run.stdout == ""
