"""Settings `dflash-tune serve` cannot run with end in one line and exit 2, through either
command (`dflash-tune serve`, `python -m backends.dflash_server`), before a model is loaded
or a port bound."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dflash_core.training.pair import ensure_pair

PAIR = ensure_pair()
COMMANDS = {"tuner": ["-m", "tuner", "serve"], "server": ["-m", "backends.dflash_server"]}


@pytest.mark.parametrize("command, flags, reason", [
    ("tuner", ["--port", "70000"], "--port must be 0..65535, got 70000"),
    ("server", ["--port", "70000"], "--port must be 0..65535, got 70000"),
    ("tuner", ["--max-context", "1"], ("--max-context 1 is below 9: a request needs a prompt "
                                       "token and a verify window of 8 tokens")),
    ("server", ["--max-context", "5000"], "past the target's max_position_embeddings, 4096"),
    ("tuner", ["--max-body-bytes", "0"], "--max-body-bytes must be a positive number"),
    ("server", ["--header-timeout", "-1"], "--header-timeout must be a positive number"),
    ("server", ["--shutdown-grace", "-1"], "--shutdown-grace must be 0 or more seconds"),
    ("tuner", ["--max-context", "1e9"], "Invalid value for '--max-context'"),
    ("server", ["--max-context", "1e9"], "Invalid value for '--max-context'"),
])
def test_a_setting_the_server_cannot_run_with_is_one_line_and_exit_2(command, flags, reason):
    run = subprocess.run(
        [sys.executable, *COMMANDS[command], "--target", str(PAIR / "target"),
         "--drafter", str(PAIR / "drafter"), "--method", "dflash", *flags],
        check=False, capture_output=True, text=True, timeout=120)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2 and len(lines) == 1 and reason in lines[0], run.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unreadable_tokenizer_is_one_line_and_exit_2(tmp_path, command):
    import shutil

    target = tmp_path / "target"
    shutil.copytree(PAIR / "target", target)
    (target / "tokenizer.json").write_text("garbage{")
    run = subprocess.run(
        [sys.executable, *COMMANDS[command], "--target", str(target),
         "--drafter", str(PAIR / "drafter"), "--method", "dflash"],
        check=False, capture_output=True, text=True, timeout=120)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2 and len(lines) == 1, run.stderr
    assert "tokenizer.json is not a tokenizer" in lines[0]
