from __future__ import annotations

import json
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from cli_helpers import cli
from cli_helpers import write_config
from plain_space import write_plain_space

from tuner.level_search import LEVEL_KEY
from tuner.study import MEASURED_KEY


@pytest.fixture(scope="module")
def studied(tmp_path_factory) -> Path:
    """A folder whose tuner.yaml points at a DB holding a finished 40-trial study of the
    default node; what `run` said is in run.stderr."""
    folder = tmp_path_factory.mktemp("studied")
    write_config(folder, model={"path": "/models/My Kimi's \"K2.6\""}, study={"n_trials": 40})
    result = cli("run", cwd=folder)
    assert result.returncode == 0, result.stderr
    (folder / "run.stderr").write_text(result.stderr)
    return folder


def _records(folder: Path) -> list[tuple]:
    with sqlite3.connect(folder / "results.db") as db:
        return db.execute("select trial_number, status, params_json, measured "
                          "from dflash_tune_trials order by trial_number").fetchall()


def _optuna_states(folder: Path) -> list[str]:
    return [t.state.name for t in _optuna_trials(folder)]


def _optuna_trials(folder: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="pcie8-kimi-sglang",
                             storage=f"sqlite:///{folder / 'results.db'}").trials


def _sampled(folder: Path) -> int:
    """Measured trials the sampler proposed: the budget, without the level walks' ends."""
    return sum(1 for t in _optuna_trials(folder)
               if t.user_attrs.get(MEASURED_KEY) and LEVEL_KEY not in t.user_attrs)


def test_run_records_every_trial_and_measures_the_baseline_first(studied):
    rows = _records(studied)
    assert [r[0] for r in rows] == list(range(len(rows)))
    assert _sampled(studied) == 40  # n_trials counts what a backend measured
    assert json.loads(rows[0][2])["speculative_algorithm"] == "none" and rows[0][3]
    with sqlite3.connect(studied / "results.db") as db:
        levels = db.execute("select count(*) from dflash_tune_measurements "
                            "where trial_number = 0").fetchone()[0]
    assert levels == 7  # one row per concurrency level of the workload


def test_samples_breaking_the_space_constraints_are_recorded_but_not_measured(studied):
    rejected = [r for r in _records(studied) if not r[3]]
    for _, status, params_json, _ in rejected:
        assert status == "invalid_config"
        params = json.loads(params_json)  # TP4 with EP8 is the one layout the space rejects
        assert params["ep_size"] > params["tp_size"] or params.get("enable_dp_attention")


def test_emit_flags_prints_only_a_command_that_keeps_the_model_path_whole(studied):
    result = cli("best", "--emit-flags", cwd=studied)
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    assert result.stdout.count("\n") == 1
    if argv[0] == "env":  # DDTree knobs without a flag travel as environment variables
        start = argv.index("python")
        assert all("=" in word for word in argv[1:start])
        argv = argv[start:]
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--model-path") + 1] == "/models/My Kimi's \"K2.6\""


def test_best_json_record_and_vllm_flags(studied):
    record = json.loads(cli("best", "--format", "json", cwd=studied).stdout)
    assert record["target_concurrency"] == 64 and record["output_tok_s_at_target"] > 0
    # The SGLang space asks nothing of vLLM's graph mode, and vLLM's default (FULL graphs) is
    # refused with DFlash: vLLM is offered the best it can launch, DFlash only eagerly.
    vllm = cli("best", "--emit-flags", "--backend", "vllm", cwd=studied)
    assert vllm.returncode == 0, vllm.stderr
    argv = shlex.split(vllm.stdout)
    assert argv[:2] == ["vllm", "serve"]
    assert "--speculative-config" not in argv or "--enforce-eager" in argv


def test_a_stricter_sla_changes_or_empties_the_choice(studied):
    loose = json.loads(cli("best", "--format", "json", cwd=studied).stdout)
    tpot = loose["params"]  # the chosen one meets the study's SLA
    impossible = cli("best", "--sla", "tpot_p50_ms<=0.001", cwd=studied)
    assert impossible.returncode == 1
    assert ("no successful configuration meets the SLA (tpot_p50_ms<=0.001, ttft_p50_ms<=5000, "
            "ttft_p99_ms<=15000)") in impossible.stderr
    assert "tpot_p50_ms<=0.001 is missed by" in impossible.stderr
    assert tpot


def test_best_without_a_results_db_exits_1_and_creates_none(tmp_path):
    write_config(tmp_path)
    result = cli("best", cwd=tmp_path)
    assert result.returncode == 1
    assert "no results DB at" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "results.db").exists()


def test_best_for_a_study_the_db_lacks_names_the_ones_it_has(studied):
    result = cli("best", "--study", "absent", cwd=studied)
    assert result.returncode == 1
    assert "no study named 'absent'" in result.stderr
    assert "(studies: pcie8-kimi-sglang)" in result.stderr


def test_best_when_every_trial_failed_exits_1(tmp_path):
    # Kimi K2.6 weights take ~69 GiB a GPU at TP8, leaving an 80 GB H100 at most ~4 GiB of KV
    # (~60K tokens of MLA latent): no KV pool holds one 200K-token request.
    write_config(tmp_path, hardware={"gpu": "h100-sxm"}, study={"n_trials": 8},
                 workload={"input_len": 200_000})
    assert cli("run", cwd=tmp_path).returncode == 0
    statuses = {r[1] for r in _records(tmp_path)}
    assert "oom" in statuses and "ok" not in statuses
    result = cli("best", cwd=tmp_path)
    assert result.returncode == 1
    assert "all 8 measured trials failed" in result.stderr


def test_best_does_not_import_optuna(studied):
    code = ("import sys; sys.argv = ['dflash-tune', 'best', '--emit-flags']\n"
            "from tuner.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('optuna' in sys.modules, 'torch' in sys.modules, file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code], cwd=studied, capture_output=True,
                            text=True, timeout=60)
    assert result.stderr.strip().endswith("False False")


def test_interrupted_run_keeps_finished_trials_and_resumes(tmp_path):
    write_config(tmp_path, study={"n_trials": 100000})
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "run"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if (tmp_path / "results.db").exists() and len(_safe_records(tmp_path)) >= 5:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "run again to resume" in err
    states = _optuna_states(tmp_path)
    assert "RUNNING" not in states
    kept = _records(tmp_path)
    assert states.count("COMPLETE") + states.count("PRUNED") == len(kept) >= 5
    measured = sum(1 for r in kept if r[3])
    result = cli("run", "--trials", str(measured + 3), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "resuming study" in result.stderr
    assert _sampled(tmp_path) == measured + 3


def _safe_records(folder: Path) -> list[tuple]:
    try:
        return _records(folder)
    except sqlite3.OperationalError:  # tables not created yet, or locked for a moment
        return []




def test_best_schedule_gives_the_best_speculation_setting_per_concurrency_band(studied):
    result = cli("best", "--schedule", cwd=studied)
    assert result.returncode == 0, result.stderr
    schedule = json.loads(result.stdout)
    bands = schedule["bands"]
    assert bands and schedule["layout"]["tp_size"] in (4, 8)
    assert bands[0]["min_concurrency"] == 1
    for before, after in zip(bands, bands[1:]):  # contiguous, ordered, each a different choice
        assert before["max_concurrency"] < after["min_concurrency"]
        assert {k: v for k, v in before.items() if k.startswith("speculative")} != {
            k: v for k, v in after.items() if k.startswith("speculative")}
    # Each level's choice is the fastest within the SLA of the trials launched like the chosen
    # configuration (everything but the speculation knobs equal), and at the target it is
    # the configuration best chose.
    chosen = json.loads(cli("best", "--format", "json", cwd=studied).stdout)
    with sqlite3.connect(studied / "results.db") as db:
        rows = db.execute("select t.trial_number, t.params_json, m.concurrency, m.output_tok_s, "
                          "m.tpot_p50_ms, m.ttft_p50_ms, m.ttft_p99_ms from "
                          "dflash_tune_measurements m join dflash_tune_trials t on "
                          "t.trial_number = m.trial_number where t.status = 'ok'").fetchall()
    fixed = schedule["launch"] | schedule["layout"]
    for band in bands:
        for level, rate in band["output_tok_s"].items():
            rates = [r for _, params_json, c, r, tpot, ttft, ttft99 in rows
                     if c == int(level) and tpot <= 100 and ttft <= 5000 and ttft99 <= 15000
                     and _launched_like(json.loads(params_json), fixed)]
            assert rate == pytest.approx(max(rates))
    top = next(b for b in bands if b["min_concurrency"] <= 64 <= b["max_concurrency"])
    assert top["trial"]["64"] == chosen["trial"]


def _launched_like(params: dict, fixed: dict) -> bool:
    from backends.launch_params import LaunchParams

    launch = LaunchParams.from_params(params)
    return all(getattr(launch, k) == v for k, v in fixed.items())


def test_run_ends_with_the_table_best_shows(studied):
    said = (studied / "run.stderr").read_text()
    assert "40 trials run" in said
    table = said[said.index("Pareto front at concurrency 64"):]
    assert table.startswith(cli("best", cwd=studied).stderr.splitlines()[0].rstrip())
    for header in ("TTFT", "TPOT", "/GPU", "plain", "queues"):
        assert header in table


def test_optuna_sees_metric_names_latencies_and_no_zero_valued_failures(studied):
    from tuner.objective import FAILURE_KEY, OBJECTIVES

    study = optuna.load_study(study_name="pcie8-kimi-sglang",
                              storage=f"sqlite:///{studied / 'results.db'}")
    assert study.metric_names == list(OBJECTIVES)
    by_state: dict[str, list] = {}
    for t in study.trials:
        by_state.setdefault(t.state.name, []).append(t)
    assert set(by_state) == {"COMPLETE", "PRUNED"}
    for t in by_state["COMPLETE"]:
        assert FAILURE_KEY not in t.user_attrs and min(t.values) > 0
        assert t.user_attrs["ttft_p50_ms@target"] > 0 and "tpot_p99_ms@target" in t.user_attrs
    failed = {t.user_attrs[FAILURE_KEY] for t in by_state["PRUNED"]}
    assert "invalid_config" in failed and "oom" in failed  # rejected samples and OOMs
    assert all(max(t.constraints.values()) > 0 for t in by_state["PRUNED"])  # still steer TPE
    statuses = {number: status for number, status, _, _ in _records(studied)}
    assert all(statuses[t.number] != "ok" for t in by_state["PRUNED"])


def test_serve_flags_on_the_default_study_render_its_layout_for_serve(studied):
    result = cli("best", "--emit-flags", "--backend", "dflash", cwd=studied)
    assert result.returncode == 0, result.stderr
    argv = result.stdout.split()
    assert argv[:2] == ["dflash-tune", "serve"] and "--tp-size" in argv


SMOKE_SPACE = Path(__file__).resolve().parents[2] / "search_spaces" / "smoke.yaml"


def test_a_space_whose_constraints_reject_everything_exits_2_naming_the_constraint(tmp_path):
    space = tmp_path / "never.yaml"
    space.write_text(SMOKE_SPACE.read_text().replace(
        '  - "tp_size * dp_size == gpus"', '  - "tp_size * dp_size == gpus"\n  - "1 == 2"'))
    write_config(tmp_path, study={"n_trials": 3}, search_space=str(space))
    result = cli("run", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: stopped after 0 measured trials")
    assert f"search space '{space}'" in last and "most often `1 == 2`" in last
    assert not any(r[3] for r in _records(tmp_path))  # every sample rejected, none measured


def test_a_resume_that_changes_what_a_trial_means_is_refused(tmp_path):
    write_config(tmp_path, study={"n_trials": 3})
    assert cli("run", cwd=tmp_path).returncode == 0
    before = _records(tmp_path)
    write_config(tmp_path, study={"n_trials": 6}, hardware={"gpu": "h200-sxm", "gpus": 4},
                 search_space="smoke")
    result = cli("run", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "study 'pcie8-kimi-sglang' was run with other settings" in line
    assert 'hardware.gpu: "rtx-pro-6000-server" -> "h200-sxm"' in line
    assert "hardware.gpus: 8 -> 4" in line and 'search_space: "pcie8_kimi" -> "smoke"' in line
    assert "--study NEW_NAME" in line and "n_trials" not in line
    assert _records(tmp_path) == before
    with sqlite3.connect(tmp_path / "results.db") as db:  # the stored config is the first run's
        stored = json.loads(db.execute("select config_json from dflash_tune_studies").fetchone()[0])
    assert stored["hardware"]["gpu"] == "rtx-pro-6000-server"
    assert cli("run", "--study", "h200", cwd=tmp_path).returncode == 0  # a new study is fine


def test_a_resume_may_raise_n_trials_and_change_the_sla(tmp_path):
    write_config(tmp_path, study={"n_trials": 3})
    assert cli("run", cwd=tmp_path).returncode == 0
    write_config(tmp_path, study={"n_trials": 5, "sampler": "random"},
                 workload={"sla": ["tpot_p50_ms<=80"]}, tuning={"repeats": 2})
    result = cli("run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with sqlite3.connect(tmp_path / "results.db") as db:
        stored = json.loads(db.execute("select config_json from dflash_tune_studies").fetchone()[0])
    assert stored["workload"]["sla"] == ["tpot_p50_ms<=80"] and stored["study"]["n_trials"] == 5


def test_a_search_space_edited_in_place_is_refused_on_resume(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(SMOKE_SPACE.read_text())
    write_config(tmp_path, study={"n_trials": 3}, search_space=str(space))
    assert cli("run", cwd=tmp_path).returncode == 0
    space.write_text(SMOKE_SPACE.read_text().replace("choices: [1, 2]", "choices: [1, 2, 4]"))
    result = cli("run", "--trials", "5", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "dynamic value space" not in result.stderr
    assert "tp_size: choices [1, 2] -> [1, 2, 4]" in result.stderr.strip().splitlines()[-1]


def test_a_resumed_study_measures_no_configuration_twice(tmp_path):
    # A resume that reused the study's seed would replay the first run's samples one for one.
    # The sampler's trials alone: the level walks never measure a configuration held already.
    space = write_plain_space(tmp_path)
    write_config(tmp_path, study={"n_trials": 5}, search_space=str(space),
                 tuning={"level_search": False})
    assert cli("run", cwd=tmp_path).returncode == 0
    assert cli("run", "--trials", "10", cwd=tmp_path).returncode == 0
    measured = [r[2] for r in _records(tmp_path) if r[3]]
    assert len(measured) == 10
    assert len(set(measured)) == 10, "a configuration was measured twice"
