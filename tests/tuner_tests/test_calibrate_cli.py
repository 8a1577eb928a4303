"""`dflash-tune calibrate --reference FILE`: files that are not references, and the format\ndocs/CALIBRATE.md documents (real subprocess)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from cli_helpers import cli

from backends.perf_model.constants import Efficiency

REPO = Path(__file__).resolve().parents[2]

GOOD_DEPLOYMENT = "deployment: {gpu: h200-sxm, gpus: 8, model: kimi-k2.6}\n"
GOOD_WORKLOAD = "workload: {input_len: 1024, output_len: 512, concurrency: [1, 8]}\n"


@pytest.mark.parametrize("text, message", [
    ("", "is empty"),
    ("# only a comment\n", "is empty"),
    ("deployment: [unclosed\n", "not valid YAML"),
    ("deployment:\n  gpu: h200\n gpus: 8\n", "not valid YAML"),
    ("- a\n- list\n", "holds a list, not a mapping"),
    (GOOD_DEPLOYMENT + GOOD_WORKLOAD, "observations must be a non-empty list"),
    (GOOD_DEPLOYMENT + "workload: {input_len: 1024}\nobservations: [{name: x}]\n",
     "missing key 'output_len'"),
    (GOOD_DEPLOYMENT + GOOD_WORKLOAD + "observations: [{name: x, at: 3, output_tok_s: 9}]\n",
     "at must be 'peak' or one of the workload's concurrency levels [1, 8], got 3"),
    (GOOD_DEPLOYMENT + GOOD_WORKLOAD + "observations: [just a string]\n",
     "each observation must be a mapping"),
])
def test_calibrate_reference_that_is_not_one_is_a_one_line_error(tmp_path, text, message):
    reference = tmp_path / "mine.yaml"
    reference.write_text(text)
    run = cli("calibrate", "--reference", str(reference), cwd=tmp_path)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert message in run.stderr and str(reference) in run.stderr and run.stdout == ""


def test_the_reference_example_in_the_docs_calibrates(tmp_path):
    doc = (REPO / "docs" / "CALIBRATE.md").read_text()
    example = next(block for block in re.findall(r"```yaml\n(.*?)```", doc, re.DOTALL)
                   if "observations:" in block)
    reference = tmp_path / "documented.yaml"
    reference.write_text(example)
    run = cli("calibrate", "--reference", str(reference), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    fitted = yaml.safe_load(run.stdout)
    assert set(fitted) == set(Efficiency.names())
    assert "EP8 DFlash c1" in run.stderr
