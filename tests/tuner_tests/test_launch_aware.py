"""The launch-aware strategy end to end on the simulated node (noisy, launches cost minutes):
budget kept, finalists re-measured in fresh launches, gates run, `best` names the winner, and a
resumed study continues instead of starting over."""

from __future__ import annotations

import json

import pytest
from cli_helpers import cli
from cli_helpers import write_config

from tuner import records
from tuner.config import load_config
from tuner.dashboard.report import write_report
from tuner.launches.run import build
from tuner.launches.worker import WINNER_KEY
from tuner.selection import config_key

SIM = {"name": "simulated", "simulation": {
    "noise": 0.15, "launch_s": 180.0, "seed": 3, "acceptance": [0.7],
    "efficiency": {"bandwidth_efficiency": 0.5, "collective_latency_us": 70.0,
                   "launch_overhead_us": 30.0, "matmul_fixed_us": 0.3}}}
TUNING = {"strategy": "launch_aware", "launches": 14, "per_round": 3, "finalists": 3,
          "screen_samples": 300, "gates": {"soak_s": 60.0}}


@pytest.fixture
def study_file(tmp_path):
    return write_config(tmp_path, backend=SIM, tuning=TUNING)


def test_launch_aware_study_spends_its_budget_and_confirms_the_winner(study_file, tmp_path):
    cfg = load_config(study_file)
    strategy = build(cfg)
    outcome = strategy.run()
    assert outcome.launches == len(strategy.launcher.launches) <= TUNING["launches"]
    assert outcome.launch_s == pytest.approx(180.0 * outcome.launches)
    assert outcome.winner is not None and outcome.runs >= cfg.tuning.repeats
    first = strategy.launcher.launches[0]
    assert first.params["speculative_algorithm"] == "none"  # the baseline goes first
    runs = [x for x in strategy.launcher.launches if x.key == config_key(outcome.winner.params)]
    assert runs[-1].excerpt == records.GATES_PASSED  # its last launch ran the gates
    # Every launch is one recorded trial with the levels its SLA search chose.
    trials = records.load_trials(records.connect(cfg.study.storage), cfg.study.name)
    assert len(trials) == outcome.launches and 1 in trials[0].measurements
    # The winner is decided once: the study keeps it for every worker under the same settings,
    # and a study resumed under others decides again.
    study = strategy.launcher.study
    kept = study.user_attrs[WINNER_KEY]
    assert kept["key"] == config_key(outcome.winner.params)
    study.set_user_attr(WINNER_KEY, {**kept, "key": "another configuration"})
    assert build(cfg)._decide().winner is None  # the kept decision, though no launch matches
    other = load_config(study_file, {"tuning.long_window_factor": 5.0})
    assert build(other)._decide().winner.key == kept["key"]  # decided again, from the launches
    # optuna-dashboard names what a launch reported
    assert strategy.launcher.study.metric_names == ["output_tok_s@sla_limit", "tok_s_per_user@1"]
    chosen = json.loads(cli("best", "--format", "json", "-c", str(study_file),
                            cwd=tmp_path).stdout)
    assert config_key(chosen["params"]) == config_key(outcome.winner.params)
    assert chosen["runs"] >= cfg.tuning.repeats
    # The report names the same configuration, read where the study read it.
    page = write_report(cfg.study.storage, cfg.study.name, tmp_path / "r.html").read_text()
    assert f"{chosen['output_tok_s_at_target']:,.0f} output tok/s at its SLA limit" in page


def test_a_resumed_launch_aware_study_keeps_its_launches(tmp_path):
    # A smaller budget than the other test's: the resume is what is checked here.
    study_file = write_config(tmp_path, backend=SIM, tuning=TUNING | {
        "launches": 8, "screen_samples": 100})
    cfg = load_config(study_file)
    ran = cli("run", "-c", str(study_file), cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    first = records.load_trials(records.connect(cfg.study.storage), cfg.study.name)
    again = cli("run", "-c", str(study_file), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"{len(first)} launches kept" in again.stderr
    # The winner already passed its gates: nothing is launched again.
    assert len(records.load_trials(records.connect(cfg.study.storage), cfg.study.name)) == len(first)
