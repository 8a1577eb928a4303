"""`--help` at 80 columns: every option of every command is shown whole."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer

from tuner.cli import app


def _commands() -> list:
    root = typer.main.get_command(app)
    out = []
    for name, command in root.commands.items():
        if hasattr(command, "commands"):  # a group: its subcommands
            out += [(f"{name} {sub}", c) for sub, c in command.commands.items()]
        else:
            out.append((name, command))
    return out


@pytest.mark.parametrize("name, command", _commands(), ids=[n for n, _ in _commands()])
def test_help_at_80_columns_shows_every_option_whole(tmp_path, name, command):
    env = {**os.environ, "COLUMNS": "80"}
    run = subprocess.run([sys.executable, "-m", "tuner", *name.split(), "--help"], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    longs = [o for p in command.params for o in p.opts if o.startswith("--")]
    assert longs
    for option in longs:
        assert option in run.stdout, option
