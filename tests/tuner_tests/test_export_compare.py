"""`dflash-tune export` (every trial and level, CSV / JSON / Parquet) and `dflash-tune compare`
(two studies' best side by side, in one DB or two)."""

from __future__ import annotations

import csv
import importlib.util
import io
import json

from cli_helpers import cli
from made_study import add_study
from made_study import level
from made_study import make_study
from made_study import trial

from tuner.config import load_config

PLAIN = {"speculative_algorithm": "none", "tp_size": 8}
DFLASH = {"speculative_algorithm": "dflash", "speculative_dflash_block_size": 6, "tp_size": 8}
STUDY = [trial(PLAIN, level(128, 1000.0)), trial(DFLASH, level(128, 2000.0)),
         (DFLASH | {"tp_size": 4}, [], "oom")]


def test_export_csv_has_a_row_per_trial_and_level_with_metrics_and_flags(tmp_path):
    make_study(tmp_path, STUDY)
    result = cli("export", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [(r["trial"], r["concurrency"]) for r in rows] == [
        ("0", "1"), ("0", "4"), ("0", "128"), ("1", "1"), ("1", "4"), ("1", "128"), ("2", "")]
    at_128 = rows[5]
    assert at_128["status"] == "ok" and float(at_128["output_tok_s"]) == 2000.0
    assert float(at_128["ttft_p50_ms"]) == 300.0 and at_128["speculative_dflash_block_size"] == "6"
    assert rows[6]["status"] == "oom" and rows[6]["tp_size"] == "4"
    assert {"command", "tpot_p99_ms", "output_tok_s_per_gpu", "failure"} <= set(rows[0])


def test_export_json_nests_levels_under_each_trial_and_out_writes_a_file(tmp_path):
    make_study(tmp_path, STUDY)
    out = tmp_path / "trials.json"
    result = cli("export", "--format", "json", "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and "3 trials" in result.stderr
    doc = json.loads(out.read_text())
    assert doc["study"] == "made" and len(doc["trials"]) == 3
    one = doc["trials"][1]
    assert one["params"] == DFLASH and [lv["concurrency"] for lv in one["levels"]] == [1, 4, 128]
    assert one["levels"][2]["tpot_p50_ms"] == 20.0 and doc["trials"][2]["levels"] == []
    unwritable = cli("export", "--out", str(tmp_path / "no" / "such" / "dir.csv"), cwd=tmp_path)
    assert unwritable.returncode == 1 and unwritable.stderr.count("\n") == 1


def test_export_trial_keeps_only_the_trials_named_and_refuses_unknown_ones(tmp_path):
    """`best` names two trials to measure; `export --trial` gives just their launch commands."""
    make_study(tmp_path, STUDY)
    result = cli("export", "--format", "json", "--trial", "2", "--trial", "0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [t["trial"] for t in doc["trials"]] == [0, 2]
    assert doc["trials"][0]["params"] == PLAIN and doc["trials"][1]["status"] == "oom"
    rows = list(csv.DictReader(io.StringIO(cli("export", "--trial", "1", cwd=tmp_path).stdout)))
    assert {r["trial"] for r in rows} == {"1"} and len(rows) == 3
    unknown = cli("export", "--trial", "1", "--trial", "7", "--trial", "9", cwd=tmp_path)
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert unknown.stderr.strip() == ("error: no trial 7, 9 in study 'made' (it holds trials "
                                      "0-2)")


def test_export_parquet_writes_the_csv_rows_or_says_to_install_pyarrow(tmp_path):
    make_study(tmp_path, STUDY)
    out = tmp_path / "trials.parquet"
    result = cli("export", "--format", "parquet", "--out", str(out), cwd=tmp_path)
    if importlib.util.find_spec("pyarrow") is None:
        assert result.returncode == 2 and not out.exists()
        assert result.stderr.strip() == ("error: --format parquet needs pyarrow: pip install "
                                         "pyarrow (or export csv or json)")
        return
    import pyarrow.parquet as pq

    assert result.returncode == 0, result.stderr
    assert pq.read_table(out).num_rows == 7


def test_compare_puts_two_studies_best_side_by_side_from_one_db_or_two(tmp_path):
    make_study(tmp_path, STUDY, name="pcie")
    cfg = load_config(tmp_path / "tuner.yaml")
    h200 = [trial(PLAIN, level(128, 1500.0)), trial(DFLASH, level(128, 3000.0, ttft=200.0))]
    add_study(cfg.study.storage, "h200", cfg.model_dump(mode="json") | {
        "hardware": {"gpu": "h200-sxm", "gpus": 8}}, h200)
    result = cli("compare", "pcie", "h200", "--format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["a"]["best"]["trial"] == 1 and doc["b"]["best"]["output_tok_s"] == 3000.0
    assert doc["b"]["hardware"] == "8x h200-sxm"
    assert doc["b_over_a"]["output_tok_s"] == 1.5 and doc["b_over_a"]["ttft_p50_ms"] == 200 / 300
    table = cli("compare", "pcie", "h200", cwd=tmp_path)
    assert table.returncode == 0 and table.stdout == ""
    for cell in ("8x h200-sxm", "1.50x", "TTFT p50 ms", "configuration"):
        assert cell in table.stderr
    other = f"sqlite:///{tmp_path / 'other.db'}"
    add_study(other, "h200", cfg.model_dump(mode="json"), h200)
    apart = cli("compare", "pcie", "h200", "--storage-b", other, "--format", "json",
                cwd=tmp_path)
    assert json.loads(apart.stdout)["b"]["storage"] == other
    missing = cli("compare", "pcie", "absent", cwd=tmp_path)
    assert missing.returncode == 1 and "study 'absent': no study named 'absent'" in missing.stderr


def test_overlay_data_gives_a_dashboard_both_studies_trials_and_choices(tmp_path):
    from tuner.compare import overlay_data

    make_study(tmp_path, STUDY, name="before")
    cfg = load_config(tmp_path / "tuner.yaml")
    add_study(cfg.study.storage, "after", cfg.model_dump(mode="json"), STUDY[:2])
    data = overlay_data(cfg, "before", "after")
    assert [len(data[k]["trials"]) for k in ("a", "b")] == [3, 2]
    assert data["a"]["best"]["trial"] == data["b"]["best"]["trial"] == 1
