"""A tpe study on a measuring backend ends by re-measuring its finalists in fresh launches, so
`best` can name a configuration; on the performance model nothing is re-measured."""

from __future__ import annotations

import json
from collections import Counter

from cli_helpers import UNBOUNDED_TTFT
from cli_helpers import cli
from cli_helpers import write_config

from tuner import records
from tuner.config import load_config
from tuner.finals import owed_runs
from tuner.selection import config_key

SIM = {"name": "simulated", "simulation": {"noise": 0.15, "launch_s": 180.0, "seed": 1}}


def test_a_noisy_tpe_study_re_measures_finalists_and_best_names_a_confirmed_one(tmp_path):
    # A 12-trial study has nothing that serves 128 requests without queueing: the SLA's TTFT
    # bounds (tests/tuner_tests/test_best_report.py) would leave nothing to choose.
    path = write_config(tmp_path, backend=SIM, study={"n_trials": 12},
                        tuning={"finalists": 3, "repeats": 3}, workload=UNBOUNDED_TTFT)
    ran = cli("run", "-c", str(path), cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "finalist re-measurements in fresh launches" in ran.stderr
    cfg = load_config(path)
    trials = records.load_trials(records.connect(cfg.study.storage), cfg.study.name)
    runs = Counter(config_key(t.params) for t in trials if t.ok)
    assert len([t for t in trials if t.measured]) > 12  # the finals came on top of the budget
    chosen = json.loads(cli("best", "-c", str(path), "--format", "json", cwd=tmp_path).stdout)
    assert chosen["runs"] == runs[config_key(chosen["params"])] >= 3


def test_the_model_backend_needs_no_finals(tmp_path):
    path = write_config(tmp_path, study={"n_trials": 6})
    ran = cli("run", "-c", str(path), cwd=tmp_path)
    assert ran.returncode == 0 and "finalist" not in ran.stderr


def test_the_better_half_of_the_finalists_owes_every_repeat():
    assert [owed_runs(r, 4, 3) for r in range(4)] == [3, 3, 2, 2]
    assert [owed_runs(r, 3, 3) for r in range(3)] == [3, 3, 2]
    assert owed_runs(0, 1, 5) == 5 and owed_runs(1, 4, 1) == 1
