"""What `best` says about a study whose numbers the test chose: an SLA that sees TTFT, the
queueing mark and warning, the metrics of the table and JSON, a schedule that agrees with the
choice, and a command for our own server that is honest about what it can run."""

from __future__ import annotations

import json
import shlex

import pytest

from backends.perf_model.shipped import speedup_error
from cli_helpers import cli
from made_study import level
from made_study import make_study
from made_study import trial

PLAIN = {"speculative_algorithm": "none", "tp_size": 8, "max_running_requests": 128}


def _dflash(block: int, running: int, **more) -> dict:
    return {"speculative_algorithm": "dflash", "speculative_dflash_block_size": block,
            "tp_size": 8, "max_running_requests": running, **more}


# At concurrency 128 under tpot_p50_ms<=30: trial 1 is fastest but runs 16 requests at once,
# so the other 112 wait about 100 s for their first token; trial 2 runs them all.
QUEUEING_STUDY = [
    trial(PLAIN, level(128, 250.0, tpot=60.0)),
    trial(_dflash(5, 16), level(128, 562.0, tpot=28.0, ttft=102_270.0)),
    trial(_dflash(6, 128), level(128, 500.0, tpot=29.0, ttft=400.0), single=150.0),
    trial(_dflash(8, 128), level(128, 900.0, tpot=45.0)),
]


def _best(folder, *args: str):
    result = cli("best", *args, cwd=folder)
    return result, (json.loads(result.stdout) if "json" in args and result.returncode == 0
                    else None)


def test_the_default_sla_bounds_ttft_so_a_queueing_configuration_is_not_chosen(tmp_path):
    make_study(tmp_path, QUEUEING_STUDY)
    result, record = _best(tmp_path, "--sla", "tpot_p50_ms<=30", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert record["trial"] == 2 and not record["metrics"]["queueing"]
    assert record["sla"] == ["tpot_p50_ms<=30", "ttft_p50_ms<=5000", "ttft_p99_ms<=15000"]
    assert record["warnings"] == [] and "warning" not in result.stderr


def test_a_queueing_winner_is_marked_and_warned_about_when_ttft_is_unbounded(tmp_path):
    make_study(tmp_path, QUEUEING_STUDY, workload={"ttft_p50_ms": None, "ttft_p99_ms": None})
    result, record = _best(tmp_path, "--sla", "tpot_p50_ms<=30", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert record["trial"] == 1 and record["metrics"]["queueing"]
    assert "warning: ttft_p50_ms is 102,270 ms" in result.stderr
    assert "runs at most 16 requests at once but is judged at concurrency 128" in result.stderr
    table = cli("best", "--sla", "tpot_p50_ms<=30", cwd=tmp_path).stderr
    assert "queues" in table and "yes" in table.split("queues", 1)[1]


def test_best_shows_latencies_per_gpu_rate_and_speedup_over_plain_and_returns_the_front(
        tmp_path):
    make_study(tmp_path, QUEUEING_STUDY)
    table = cli("best", "--sla", "tpot_p50_ms<=30", cwd=tmp_path).stderr
    for header in ("TTFT", "TPOT", "(total)", "/GPU", "/user", "@1", "plain"):
        assert header in table
    assert "2.00x" in table  # 500 tok/s over the plain TP8 layout's 250
    result, record = _best(tmp_path, "--format", "json", "--top", "2")
    assert result.returncode == 0, result.stderr
    front = record["front"]
    assert [row["trial"] for row in front] == [3, 2] and record["trial"] == 3
    chosen = record["metrics"]
    assert chosen["output_tok_s"] == 900.0 and chosen["output_tok_s_per_gpu"] == 112.5
    assert chosen["ttft_p50_ms"] == 300.0 and chosen["tpot_p50_ms"] == 45.0
    assert chosen["tok_s_per_user"] == 900.0 / 128 and chosen["tok_s_per_user_at_1"] == 100.0
    assert chosen["speedup_vs_plain"] == 900.0 / 250.0 and chosen["plain_trial"] == 0


def test_best_says_where_speculation_stops_paying_in_its_table_and_record(tmp_path):
    make_study(tmp_path, [trial(PLAIN, level(128, 1000.0), single=100.0),
                          trial(_dflash(6, 128), level(128, 600.0), single=150.0)])
    said = cli("best", cwd=tmp_path).stderr
    assert ("speculation vs plain (the best configuration of each at each concurrency): "
            "1: 1.50x · 4: 1.50x · 128: 0.60x; speculation stops paying from concurrency 128"
            in " ".join(said.split()))
    result, record = _best(tmp_path, "--format", "json")
    assert result.returncode == 0, result.stderr
    assert record["speculation_vs_plain"] == {
        "by_concurrency": [{"concurrency": 1, "speedup": 1.5}, {"concurrency": 4, "speedup": 1.5},
                           {"concurrency": 128, "speedup": 0.6}],
        "stops_paying_at": 128, "note": "speculation stops paying from concurrency 128",
        "caveat": "", "margin": speedup_error(measured_kernels=True), "within_error_from": None,
        "within_error_at": [], "settle_at": None, "to_measure": []}


def test_best_says_when_the_models_speedups_are_too_close_to_parity_to_call(tmp_path):
    """A study of the performance model (its rows predicted): a speedup inside the model's
    speedup error on published sources, as the shipped fit recorded it, is not a verdict."""
    margin = speedup_error(measured_kernels=True)
    assert 0 < margin < 0.5
    make_study(tmp_path, [trial(PLAIN, level(128, 1000.0), single=100.0),
                          trial(_dflash(6, 128), level(128, 1010.0), single=150.0)])
    said = " ".join(cli("best", cwd=tmp_path).stderr.split())
    assert ("128: 1.01x; speculation beats plain decoding at every measured concurrency (from "
            "concurrency 128 on, the two are within the model's speedup error of "
            f"+-{margin:.0%}: measure there before relying on it)") in said
    assert ("to settle it at concurrency 128, measure trial 0 (TP8 plain graphs<=32 run128 "
            "mem0.88) against trial 1 (TP8 dflash b6 graphs<=32 run128 mem0.88) (`dflash-tune "
            "export --trial 0 --trial 1` has their launch commands)") in said
    _, record = _best(tmp_path, "--format", "json")
    assert record["speculation_vs_plain"]["within_error_from"] == 128
    assert record["speculation_vs_plain"]["settle_at"] == 128
    assert [row["trial"] for row in record["speculation_vs_plain"]["to_measure"]] == [0, 1]


def test_schedule_and_best_agree_when_medians_across_running_caps_disagree(tmp_path):
    ep4 = {"ep_size": 4}
    study = [
        trial({**PLAIN, **ep4}, level(128, 1200.0, tpot=104.0)),
        trial(_dflash(6, 128, **ep4), level(128, 2838.0, tpot=45.1), single=131.6),
        trial(_dflash(5, 256, **ep4), level(128, 2789.0, tpot=45.9), single=132.0),
        trial(_dflash(5, 128, **ep4), level(128, 2789.0, tpot=45.9), single=140.0),
        # Another running cap: the old schedule's median for block 6 fell to (2838 + 900) / 2.
        trial(_dflash(6, 32, **ep4), level(128, 900.0, tpot=40.0), single=131.6),
    ]
    make_study(tmp_path, study)
    _, record = _best(tmp_path, "--format", "json")
    assert record["trial"] == 1
    result = cli("best", "--schedule", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    schedule = json.loads(result.stdout)
    assert schedule["launch"]["max_running_requests"] == 128
    assert schedule["trials_used"] == 3  # launched like the chosen one (plain decoding too)
    top = schedule["bands"][-1]
    assert top["max_concurrency"] == 128 and top["trial"]["128"] == record["trial"]
    assert top["speculative_dflash_block_size"] == 6
    low = schedule["bands"][0]  # block 5 of the same launch is faster at light load
    assert (low["min_concurrency"], low["max_concurrency"]) == (1, 4)
    assert low["speculative_dflash_block_size"] == 5 and low["trial"] == {"1": 3, "4": 3}


def test_serve_flags_for_a_multi_gpu_study_carry_its_tensor_parallel_layout(tmp_path):
    make_study(tmp_path, QUEUEING_STUDY)
    result = cli("best", "--emit-flags", "--backend", "dflash", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    assert argv[:2] == ["dflash-tune", "serve"] and argv[argv.index("--tp-size") + 1] == "8"


def test_serve_command_has_its_own_port_and_label_and_no_unreleased_ddtree_note(tmp_path):
    ddtree = {"speculative_algorithm": "ddtree", "speculative_dflash_block_size": 8,
              "speculative_ddtree_budget": 16, "tp_size": 1, "max_running_requests": 128}
    plain = {**PLAIN, "tp_size": 1}
    make_study(tmp_path, [trial(plain, level(128, 250.0, gpus=1)),
                          trial(ddtree, level(128, 600.0, gpus=1))], hardware={"gpus": 1})
    serve = cli("best", "--backend", "dflash", cwd=tmp_path)
    assert serve.returncode == 0, serve.stderr
    argv = shlex.split(serve.stdout)
    assert argv[:2] == ["dflash-tune", "serve"] and argv[argv.index("--port") + 1] == "8000"
    assert "no released" not in serve.stderr
    legend = next(line for line in serve.stderr.splitlines() if "ddtree b8" in line)
    assert "mem" not in legend and "TP1" not in legend
    sglang = cli("best", cwd=tmp_path)
    assert "DDTree is in no released SGLang" in sglang.stderr
    assert shlex.split(sglang.stdout.splitlines()[-1])[-1] == "30000"


@pytest.mark.parametrize("measured_kernels", [None, False], ids=["tables", "roofline"])
def test_best_names_the_winners_knobs_the_model_cannot_price(tmp_path, measured_kernels):
    """On the node's measured tables (the default there) the model prices the custom all-reduce
    against NCCL; the roofline prices neither."""
    collectives = _dflash(6, 128, nccl_proto="LL128", disable_custom_all_reduce=True)
    make_study(tmp_path, [trial(PLAIN, level(128, 250.0, tpot=25.0)),
                          trial(collectives, level(128, 700.0, tpot=25.0))],
               backend={"measured_kernels": measured_kernels})
    result, record = _best(tmp_path, "--format", "json")
    assert result.returncode == 0, result.stderr
    unpriced = ({"nccl_proto": "LL128"} if measured_kernels is None
                else {"disable_custom_all_reduce": True, "nccl_proto": "LL128"})
    assert record["measured_only"] == unpriced
    assert record["predicted_only"] == {}  # a study of the model: everything is predicted
    listed = ", ".join(f"{k}={v}" for k, v in unpriced.items())
    assert (f"measured only: {listed} (the performance model prices them at their "
            "defaults)") in result.stderr
    assert "NCCL_PROTO=LL128" in cli("best", "--emit-flags", cwd=tmp_path).stdout


def test_predicted_only_lists_the_values_no_real_engine_ran():
    from dataclasses import replace

    from backends.launch_params import LaunchParams
    from tuner.best import _predicted_only
    from tuner.records import TrialRecord

    def record(number: int, launch: LaunchParams, predicted: bool) -> TrialRecord:
        row = {"output_tok_s": 1.0, "predicted": predicted}
        return TrialRecord(number, "sglang", {}, "ok", True, "", {}, "", {1: row}, launch)

    ran = LaunchParams(nccl_proto="LL", speculative_algorithm="dflash")
    guessed = replace(ran, nccl_proto="LL128", speculative_dflash_block_size=4)
    trials = [record(0, ran, False), record(1, guessed, True)]
    assert _predicted_only(guessed, trials) == {"nccl_proto": "LL128",
                                                "speculative_dflash_block_size": 4}
    assert _predicted_only(ran, trials) == {}
    assert _predicted_only(guessed, trials[1:]) == {}  # nothing measured: a model study


def test_vllm_is_refused_what_it_cannot_launch_and_told_why(tmp_path):
    """The only configuration within the SLA runs DFlash under vLLM's default FULL graphs,
    which vLLM refuses with DFlash: no vLLM command, and the reason."""
    make_study(tmp_path, [trial(PLAIN, level(128, 250.0, tpot=60.0)),
                          trial(_dflash(8, 128), level(128, 900.0, tpot=25.0))])
    assert cli("best", "--sla", "tpot_p50_ms<=30", cwd=tmp_path).returncode == 0
    result = cli("best", "--sla", "tpot_p50_ms<=30", "--emit-flags", "--backend", "vllm",
                 cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert "can be launched by the requested engine" in result.stderr


def test_vllm_flags_carry_the_graph_mode_its_dflash_runs_with(tmp_path):
    full = _dflash(8, 128)  # vLLM's default graph mode: refused with DFlash
    piecewise = _dflash(6, 128, cudagraph_mode="PIECEWISE")
    make_study(tmp_path, [trial(PLAIN, level(128, 250.0, tpot=25.0)),
                          trial(full, level(128, 900.0, tpot=25.0)),
                          trial(piecewise, level(128, 700.0, tpot=25.0))])
    result = cli("best", "--emit-flags", "--backend", "vllm", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    graphs = json.loads(argv[argv.index("--compilation-config") + 1])
    assert argv[:2] == ["vllm", "serve"] and graphs["cudagraph_mode"] == "PIECEWISE"
