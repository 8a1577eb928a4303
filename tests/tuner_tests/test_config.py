from __future__ import annotations

import os
import subprocess
import sys
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


@pytest.mark.parametrize("section, key, value", [
    ("study", "n_trials", True),  # pydantic's lax mode reads `true` as 1
    ("study", "seed", "3"),
    ("workload", "concurrency", [1, True]),
    ("backend", "simulation", {"noise": False}),
])
def test_a_bool_or_string_where_a_number_belongs_is_refused(tmp_path, section, key, value):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({section: {key: value}}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    [line] = err.value.lines
    assert f": {section}.{key}" in line and "Input should be a valid" in line and ", got " in line


def test_a_duplicate_key_in_tuner_yaml_is_refused_with_its_path(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("study:\n  n_trials: 50\n  name: a\n  n_trials: 5\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.lines == [f"{path}: study.n_trials: duplicate key (line 4)"]
    nested = tmp_path / "n.yaml"
    nested.write_text("backend:\n  efficiency: {matmul_fixed_us: 1.0, matmul_fixed_us: 2.0}\n")
    with pytest.raises(ConfigError, match="backend.efficiency.matmul_fixed_us: duplicate key"):
        load_config(nested)


def test_a_duplicate_key_in_a_search_space_is_one_line_with_its_path(tmp_path):
    from search_spaces import SpaceError
    from search_spaces import load_space

    path = tmp_path / "s.yaml"
    path.write_text("name: s\nparams:\n  tp_size: {type: categorical, choices: [1, 2]}\n"
                    "constraints: []\nparams: {}\n")
    with pytest.raises(SpaceError) as err:
        load_space(path)
    assert str(err.value) == f"{path}: params: duplicate key (line 5)"


def test_schema_and_catalog_errors_are_reported_together_with_close_names(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"study": {"n_trials": 0}, "hardware": {"gpu": "h200"},
                                    "backend": {"name": "simulatd"},
                                    "model": {"name": "qwen3-8"}}))
    result = cli("run", "-c", str(path), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 4
    assert "study.n_trials: Input should be greater than or equal to 1" in lines[0]
    assert "backend.name: unknown backend 'simulatd'; did you mean 'simulated'?" in lines[1]
    assert "model.name: unknown model 'qwen3-8'; did you mean 'qwen3-8b'?" in lines[2]
    assert "hardware.gpu: unknown GPU 'h200'; did you mean 'h200-sxm'?" in lines[3]


def test_a_gpu_the_performance_model_never_sees_needs_no_catalog_entry(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"hardware": {"gpu": "mi300x"},
                                    "backend": {"name": "sglang"}}))
    assert load_config(path).hardware.gpu == "mi300x"
    path.write_text(yaml.safe_dump({"hardware": {"gpu": "mi300x"}}))  # the model backend
    with pytest.raises(ConfigError, match="hardware.gpu: unknown GPU 'mi300x'"):
        load_config(path)


def test_version_prints_the_package_version(tmp_path):
    import importlib.metadata

    result = cli("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout == f"dflash-tune {importlib.metadata.version('dflash-tune')}\n"


def test_debug_flag_and_env_show_the_traceback_of_a_known_error(tmp_path):
    plain = cli("run", "--storage", "x.db", cwd=tmp_path)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    debug = cli("--debug", "run", "--storage", "x.db", cwd=tmp_path)
    assert "Traceback" in debug.stderr and "ConfigError" in debug.stderr
    env = subprocess.run([sys.executable, "-m", "tuner", "run", "--storage", "x.db"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "DFLASH_TUNE_DEBUG": "1"})
    assert "Traceback" in env.stderr


def test_measured_kernels_reach_the_model_backend_from_the_config():
    """Unset, the model prices kernels from the GPU's tables wherever it has them."""
    from backends.perf_model import PerfModelBackend
    from tuner.wiring import deployment_from

    def deployment(gpu: str, measured_kernels: bool | None = None):
        return deployment_from(Config.model_validate(
            {"hardware": {"gpu": gpu}, "backend": {"measured_kernels": measured_kernels}}))

    default = deployment("rtx-pro-6000-server")
    assert PerfModelBackend(default).node.kernels.system == "rtx_pro_6000_server"
    roofline = deployment("rtx-pro-6000-server", False)
    assert not roofline.measured_kernels and PerfModelBackend(roofline).node.kernels is None
    # The workstation edition has no tables: the roofline, unless asked for tables.
    assert not deployment("rtx-pro-6000-workstation").measured_kernels
    assert deployment("rtx-pro-6000-workstation", True).measured_kernels


@pytest.mark.parametrize("key, value, says", [
    ("port", 70000, "less than or equal to 65535"),
    ("port", 0, "greater than or equal to 1"),
    ("host", "http://node1:8000", "must be a host name or an IP address"),
    ("host", "node 1", "must be a host name or an IP address"),
])
def test_a_backend_address_no_server_can_bind_is_refused(tmp_path, key, value, says):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"backend": {key: value}}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    [line] = err.value.lines
    assert f"backend.{key}" in line and says in line


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "node-1.example.com"])
def test_host_names_and_addresses_are_accepted(tmp_path, host):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"backend": {"host": host, "port": 30000}}))
    assert load_config(path).backend.host == host


def test_a_level_above_what_a_node_holds_is_refused(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"workload": {"concurrency": [1, 10**9]}}))
    with pytest.raises(ConfigError, match=r"workload: .*concurrency levels must be in 1\.\.65536"):
        load_config(path)


def _fifo(tmp_path: Path) -> str:
    os.mkfifo(tmp_path / "fifo")
    return str(tmp_path / "fifo")


def _big(tmp_path: Path) -> str:
    (tmp_path / "big.yaml").write_text("# padding\n" * 200_000)
    return str(tmp_path / "big.yaml")


@pytest.mark.parametrize("make, says", [
    (lambda tmp_path: "/dev/zero", "not a regular file"),
    (_fifo, "not a regular file"),
    (_big, "2,000,000 bytes is no tuner.yaml (at most 1,048,576)"),
])
def test_a_config_that_is_not_a_small_regular_file_is_one_line_at_once(tmp_path, make, says):
    path = make(tmp_path)
    result = cli("run", "-c", path, cwd=tmp_path, timeout=30)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [f"error: {path}: {says}; " + (
        "point -c at the right file" if "bytes" in says else "point -c at a tuner.yaml")]


@pytest.mark.parametrize("name, says", [
    ("s" * 513, "at most 512 characters"),
    ("a\x00b", "must not contain a NUL character"),
    ("", "at least 1 character"),
])
def test_a_study_name_no_results_db_can_store_is_refused(tmp_path, name, says):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"study": {"name": name}}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    [line] = err.value.lines
    assert "study.name" in line and says in line
