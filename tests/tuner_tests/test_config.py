from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuner.config import Config
from tuner.config import load_config
from tuner.errors import ConfigError

from cli_helpers import cli

REPO = Path(__file__).resolve().parents[2]


def test_shipped_tuner_yaml_matches_the_built_in_defaults():
    assert load_config(REPO / "tuner.yaml") == Config()


def test_unknown_field_is_one_line_with_its_path(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"study": {"n_trails": 5}, "workload": {"input_len": 0}}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    lines = err.value.lines
    assert any(line.endswith("study.n_trails: Extra inputs are not permitted") for line in lines)
    assert any("workload.input_len:" in line and "greater than or equal to 1" in line
               for line in lines)
    assert len(lines) == 2


def test_bad_sla_and_bad_sampler_are_reported(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"study": {"sampler": "bogo"},
                                    "workload": {"sla": ["tpot<=3"]}}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = "\n".join(err.value.lines)
    assert "study.sampler:" in text
    assert "workload.sla:" in text and "'tpot' is unknown" in text


def test_cli_overrides_win_over_the_file(config_file):
    cfg = load_config(config_file, {"study.n_trials": 7, "backend.name": None})
    assert cfg.study.n_trials == 7
    assert cfg.backend.name == "model"


def test_objective_levels_are_always_measured(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"workload": {"concurrency": [64, 8],
                                                 "target_concurrency": 32}}))
    assert load_config(path).workload.concurrency == [1, 8, 32, 64]


def test_missing_and_malformed_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("study: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_cli_config_error_exits_2_without_traceback(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"study": {"n_trials": -1, "bogus": 1}}))
    result = cli("run", "-c", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "study.n_trials:" in result.stderr and "study.bogus:" in result.stderr
    assert result.stdout == ""


def test_unknown_backend_fails_before_any_study_is_created(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"study": {"storage": f"sqlite:///{tmp_path / 'r.db'}"}}))
    result = cli("run", "-c", str(path), "--backend", "nope", cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown backend 'nope'; available: inprocess, model, serve, sglang, simulated, vllm" in result.stderr
    assert not (tmp_path / "r.db").exists()


def test_a_server_backend_must_speak_its_own_engine_flags(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"backend": {"name": "serve", "engine": "sglang"}}))
    result = cli("run", "-c", str(path), cwd=tmp_path)
    assert result.returncode == 2 and "backend.engine: dflash" in result.stderr
