"""Every `dflash-tune` example in the README's and the command reference's code blocks that the
performance model can run (run, best, export, dashboard, estimate) runs as written and exits 0:
`run` on a tiny budget in a temp folder, the rest against the study it leaves there."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from cli_helpers import cli
from cli_helpers import write_config

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/COMMANDS.md", "docs/CALIBRATE.md")
RUNNABLE = ("run", "best", "export", "dashboard", "estimate")
BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def example_commands(doc: str) -> list[list[str]]:
    """The argv (after `dflash-tune`) of each example command in ``doc``'s code blocks;
    a synopsis (`[--option]`, `GPU` placeholders) is no example."""
    found = []
    for block in BLOCK.findall((REPO / doc).read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            start = line.find("dflash-tune ")
            if start < 0:
                continue
            argv = shlex.split(line[start:], comments=True)[1:]
            if not any("[" in a or re.fullmatch(r"[A-Z][A-Z_]+", a) for a in argv):
                found.append(argv)
    return found


EXAMPLES = [(doc, argv) for doc in DOCS for argv in example_commands(doc)
            if argv[0] in RUNNABLE]


def test_the_examples_cover_every_runnable_command():
    assert {argv[0] for _, argv in EXAMPLES} == set(RUNNABLE)


@pytest.fixture(scope="module")
def study_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("readme")
    write_config(folder, study={"n_trials": 40})
    result = cli("run", cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder


@pytest.mark.parametrize("doc, argv", EXAMPLES, ids=[f"{d}: {' '.join(a)}" for d, a in EXAMPLES])
def test_an_example_command_runs_as_written(doc, argv, study_folder, tmp_path):
    if argv[0] == "run":
        write_config(tmp_path, study={"n_trials": 4})  # the example's own study, kept small
        folder = tmp_path
    else:
        folder = study_folder
    result = cli(*argv, cwd=folder, timeout=300)
    assert result.returncode == 0, f"{doc}: dflash-tune {shlex.join(argv)}\n{result.stderr}"
