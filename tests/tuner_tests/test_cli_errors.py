"""What a user sees when a command fails: their own mistake is one line and exit 2; a bug in
dflash-tune says so, exits 1, and shows its traceback only under --debug."""

from __future__ import annotations

import sys

import pytest
from cli_helpers import cli as cli_run
from cli_helpers import write_config

import tuner.estimate
from tuner import cli

ESTIMATE = ["dflash-tune", "estimate", "--gpu", "h200-sxm", "--model", "qwen3-8b",
            "--input-len", "8", "--output-len", "8", "--concurrency", "1"]


def _main(monkeypatch, capsys, *argv: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", list(argv))
    with pytest.raises(SystemExit) as stop:
        cli.main()
    return stop.value.code, capsys.readouterr().err


def _bug(req):
    return {}["levels"]  # a KeyError inside a command: a bug, whatever its text


def test_a_user_error_is_one_line_and_exit_2(monkeypatch, capsys):
    code, err = _main(monkeypatch, capsys, *ESTIMATE, "--speculative-algorithm", "ddtree",
                      "--speculative-ddtree-topk", "0")
    assert code == 2
    assert err.strip().splitlines() == [
        "error: speculative_ddtree_topk must be >= 1, or leave it out (null) for no cap, got 0"]


def test_a_bug_says_it_is_one_and_exits_1(monkeypatch, capsys):
    monkeypatch.setattr(tuner.estimate, "estimate", _bug)
    code, err = _main(monkeypatch, capsys, *ESTIMATE)
    assert code == 1
    assert "internal error: KeyError: 'levels'" in err and "this is a bug" in err
    assert "Traceback" not in err


def test_debug_shows_the_bugs_traceback(monkeypatch, capsys):
    monkeypatch.setattr(tuner.estimate, "estimate", _bug)
    monkeypatch.setenv(cli.DEBUG_ENV, "0")  # restored after: --debug sets it to 1
    monkeypatch.setattr(sys, "argv", ["dflash-tune", "--debug", *ESTIMATE[1:]])
    with pytest.raises(KeyError, match="levels"):
        cli.main()


BAD_CONSTRAINT = """name: bad
description: a constraint that cannot be evaluated for some samples
context: {gpus: GPUs on the node}
params:
  tp_size: {type: categorical, choices: [1, 2, 4, 8]}
  dp_size: {derive: "gpus // tp_size"}
constraints:
  - "gpus // (tp_size - 1) > 0"
"""


def test_a_constraint_failing_at_sampling_time_is_one_line_without_optunas_traceback(tmp_path):
    (tmp_path / "bad.yaml").write_text(BAD_CONSTRAINT)
    write_config(tmp_path, search_space="bad.yaml", study={"n_trials": 6})
    result = cli_run("run", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "failed with" not in result.stderr
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert error == ("error: bad.yaml: constraints[0]: cannot evaluate "
                     "'gpus // (tp_size - 1) > 0': integer division or modulo by zero")
    assert len(result.stderr.strip().splitlines()) <= 2  # that line and the progress bar
