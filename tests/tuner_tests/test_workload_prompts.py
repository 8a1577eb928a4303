"""What `run` says about the prompts a measuring backend will send: a bad dataset stops it
before any launch, and random token ids are warned about."""

from __future__ import annotations

from cli_helpers import cli, write_config

from dflash_core.training.pair import ensure_pair
from tuner.config import load_config
from tuner.wiring import prompt_warning

PAIR = ensure_pair()


def _serve(folder, model_path, **workload):
    return write_config(folder, model={"name": str(PAIR / "target" / "config.json"),
                                       "path": str(model_path)},
                        drafter={"path": str(PAIR / "drafter"), "block_size": 8,
                                 "num_layers": 1, "target_layers": [1, 3, 4]},
                        backend={"name": "serve", "engine": "dflash"},
                        workload={"input_len": 16, "output_len": 8, "concurrency": [1],
                                  "target_concurrency": 1, "sla": [], **workload},
                        search_space="tiny_pair")


def test_a_bad_dataset_stops_run_before_any_launch(tmp_path):
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"prompt": "x"}\n{"text": "no prompt"}\n')
    run = cli("run", "-c", str(_serve(tmp_path, PAIR / "target", dataset=str(bad))),
              cwd=tmp_path)
    assert run.returncode == 2
    assert f"workload.dataset: dataset {bad} line 2" in run.stderr
    assert not (tmp_path / "results.db").exists()  # nothing was started or stored


def test_random_token_ids_are_warned_about_and_real_prompts_are_not(tmp_path):
    elsewhere = tmp_path / "model"  # a target without held-out prompts beside it
    warning = prompt_warning(load_config(_serve(tmp_path, elsewhere)))
    assert warning and "random token ids" in warning and "workload.dataset" in warning
    assert prompt_warning(load_config(_serve(tmp_path, PAIR / "target"))) is None
    good = tmp_path / "prompts.jsonl"
    good.write_text('{"prompt": "def f():"}\n')
    assert prompt_warning(load_config(_serve(tmp_path, elsewhere, dataset=str(good)))) is None
    model = write_config(tmp_path)  # the performance model sends no prompts
    assert prompt_warning(load_config(model)) is None


def test_an_open_loop_is_refused_for_the_in_process_backend(tmp_path):
    config = write_config(tmp_path, backend={"name": "inprocess", "engine": "dflash"},
                          workload={"request_rate": 2.0})
    run = cli("run", "-c", str(config), cwd=tmp_path)
    assert run.returncode == 2 and "request_rate" in run.stderr and "inprocess" in run.stderr
