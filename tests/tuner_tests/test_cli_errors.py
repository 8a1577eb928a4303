"""What a user sees when a command fails: their own mistake is one line and exit 2; a bug in
dflash-tune says so, exits 1, and shows its traceback only under --debug."""

from __future__ import annotations

import sys

import pytest

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
