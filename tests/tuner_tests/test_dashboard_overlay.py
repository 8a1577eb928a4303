"""`dashboard --compare`: two studies (two nodes) drawn over each other, through the real CLI."""

from __future__ import annotations

import re

from cli_helpers import UNBOUNDED_TTFT, cli, write_config

from tuner.config import load_config
from tuner.runner import run_study


def _two_studies(folder) -> str:
    """One DB holding a PCIe-node study and an H200 one of the same model."""
    for name, gpu in (("pcie", "rtx-pro-6000-server"), ("h200", "h200-sxm")):
        cfg = load_config(write_config(folder, study={"name": name, "n_trials": 10},
                                       hardware={"gpu": gpu}, workload=UNBOUNDED_TTFT))
        run_study(cfg)
    return cfg.study.storage


def test_dashboard_compare_draws_both_studies_fronts_and_curves(tmp_path):
    url = _two_studies(tmp_path)
    run = cli("dashboard", "--storage", url, "--study", "pcie", "--compare", "h200",
              "--out", str(tmp_path / "both.html"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    page = (tmp_path / "both.html").read_text()
    assert set(re.findall(r'<div id="fig-([a-z]+)"', page)) == {"pareto", "concurrency"}
    for study in ("pcie", "h200"):  # every trace is named after its study
        assert f'"name":"{study}: Pareto front"' in page
        assert f'"name":"{study}: best speculative"' in page


def test_dashboard_compare_of_a_missing_study_is_one_line(tmp_path):
    url = _two_studies(tmp_path)
    run = cli("dashboard", "--storage", url, "--study", "pcie", "--compare", "nope",
              "--out", str(tmp_path / "x.html"), cwd=tmp_path)
    assert run.returncode != 0 and "nope" in run.stderr and "Traceback" not in run.stderr
