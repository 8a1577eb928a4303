"""On the performance model `run` searches each family's best at every concurrency level, so
where speculation stops paying follows from the model, not from what the sampler tried."""

from __future__ import annotations

import random

import optuna
import pytest
from cli_helpers import cli
from cli_helpers import write_config
from made_study import curve_trial

from tuner import records
from tuner.config import load_config
from tuner.crossover import configuration_curves
from tuner.crossover import family_of
from tuner.level_search import LEVEL_KEY
from tuner.level_search import LevelSearch
from tuner.level_search import walk_starts
from tuner.params import parse
from tuner.selection import config_key
from tuner.study import MEASURED_KEY
from tuner.wiring import backend_from
from tuner.wiring import space_context
from tuner.wiring import space_from
from tuner.wiring import workload_from

AR_TP = {"speculative_algorithm": "none", "tp_size": 8}
AR_EP = {**AR_TP, "ep_size": 8}
DFLASH_TP = {"speculative_algorithm": "dflash", "tp_size": 8}
# The reference space's plain TP8 launch with a running cap far below the load.
CAPPED = {"tp_size": 8, "dp_size": 1, "ep_size": 1, "enable_dp_attention": False,
          "speculative_algorithm": "none", "cuda_graph": True, "max_running_requests": 16,
          "cuda_graph_max_bs": 16, "cuda_graph_bs_ladder": "pow2", "mem_fraction_static": 0.86}


@pytest.fixture(scope="module")
def search(tmp_path_factory) -> LevelSearch:
    """The default node's space and model backend (measured kernels of the RTX PRO 6000)."""
    cfg = load_config(write_config(tmp_path_factory.mktemp("levels")))
    return LevelSearch(space_from(cfg), space_context(cfg), backend_from(cfg),
                       workload_from(cfg))


def test_each_familys_best_configuration_starts_a_walk_at_each_level():
    trials = [curve_trial(0, AR_TP, {1: 80, 64: 600}),
              curve_trial(1, {**AR_TP, "max_running_requests": 64}, {1: 70, 64: 650}),
              curve_trial(2, AR_EP, {1: 60, 64: 700}),
              curve_trial(3, DFLASH_TP, {1: 150, 64: 640}),
              curve_trial(4, {**DFLASH_TP, "speculative_dflash_block_size": 4}, {1: 900},
                          status="oom")]
    assert walk_starts(trials) == {
        1: {"AR · TP": AR_TP, "AR · EP": AR_EP, "DFlash · TP": DFLASH_TP},
        64: {"AR · TP": {**AR_TP, "max_running_requests": 64}, "AR · EP": AR_EP,
             "DFlash · TP": DFLASH_TP}}


def test_a_walk_climbs_its_levels_rate_within_its_family_to_a_local_best(search):
    start = search.output_tok_s(CAPPED, 256)
    end = search.climb(CAPPED, 256)
    reached = search.output_tok_s(end, 256)
    assert reached > 1.5 * start  # a cap of 16 requests throttles 256
    assert end["max_running_requests"] > 16
    assert family_of(parse(end)[0]) == "AR · TP"
    same_family = [n for n in search.space.neighbours(end, search.context, random.Random(0))
                   if family_of(parse(n)[0]) == "AR · TP"]
    assert same_family and all(search.output_tok_s(n, 256) <= reached for n in same_family)
    # One level priced alone is that level of the whole sweep, as a trial records it.
    sweep = {m.concurrency: m.output_tok_s
             for m in search.backend.measure(parse(end)[0], search.workload)}
    assert sweep[256] == pytest.approx(reached, rel=1e-9)


def test_run_adds_each_walks_end_once_and_a_rerun_finds_nothing_new(tmp_path):
    path = write_config(tmp_path, study={"n_trials": 8})
    first = cli("run", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    added = int(first.stderr.split(" configurations added by searching")[0].split()[-1])
    cfg = load_config(path)
    study = optuna.load_study(study_name=cfg.study.name, storage=cfg.study.storage)
    searched = [t for t in study.trials if LEVEL_KEY in t.user_attrs]
    assert 0 < added == len(searched)
    assert sum(1 for t in study.trials if t.user_attrs.get(MEASURED_KEY)
               and LEVEL_KEY not in t.user_attrs) == 8  # the walks came on top of n_trials
    trials = records.load_trials(records.connect(cfg.study.storage), cfg.study.name)
    numbers = {t.number for t in searched}
    walked = [config_key(t.params) for t in trials if t.trial_number in numbers]
    others = {config_key(t.params) for t in trials if t.trial_number not in numbers}
    assert len(set(walked)) == len(walked) and not others & set(walked), \
        "a walk measured a configuration the study held"
    # No walk ends below the best its family had sampled at the level it was searched for.
    sampled = configuration_curves([t for t in trials if t.trial_number not in numbers])
    recorded = {t.trial_number: t.params for t in trials}
    ended = {config_key(recorded[t.number]): t.user_attrs[LEVEL_KEY] for t in searched}
    for family, params, curve in configuration_curves(trials):
        if (level := ended.get(config_key(params))) is not None:
            assert curve[level] >= max(c.get(level, 0.0) for f, _, c in sampled if f == family)
    again = cli("run", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "0 configurations added by searching" in again.stderr
    assert len(records.load_trials(records.connect(cfg.study.storage), cfg.study.name)) == len(
        trials)


def test_level_search_off_leaves_the_study_at_its_sampled_trials(tmp_path):
    write_config(tmp_path, study={"n_trials": 3}, tuning={"level_search": False})
    ran = cli("run", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "configurations added" not in ran.stderr
    cfg = load_config(tmp_path / "tuner.yaml")
    trials = records.load_trials(records.connect(cfg.study.storage), cfg.study.name)
    assert sum(t.measured for t in trials) == 3


def test_a_family_stuck_below_a_coupled_pair_starts_again_from_its_layouts_faster_end(search):
    """DFlash TP8 capped at 128 requests cannot reach a 256 cap one knob at a time where the
    memory fraction that holds its KV cache must rise with it; plain TP8's end at 256 has both,
    and moved into DFlash (its block drawn afresh) it climbs past the capped start."""
    capped = {**CAPPED, "max_running_requests": 128, "cuda_graph_max_bs": 128,
              "mem_fraction_static": 0.82, "speculative_algorithm": "dflash",
              "speculative_dflash_block_size": 4}
    plain = {**CAPPED, "max_running_requests": 256, "cuda_graph_max_bs": 256,
             "mem_fraction_static": 0.92}
    alone = search.climb(capped, 256)
    ends = search.best_ends(256, {"DFlash · TP": capped, "AR · TP": plain})
    assert family_of(parse(ends["DFlash · TP"])[0]) == "DFlash · TP"
    assert search.output_tok_s(ends["DFlash · TP"], 256) > search.output_tok_s(alone, 256)
    assert search.output_tok_s(ends["AR · TP"], 256) >= search.output_tok_s(plain, 256)
    moved = search.moved(plain, "DFlash · TP")
    assert moved["speculative_algorithm"] == "dflash" and moved["max_running_requests"] == 256
    assert search.moved(plain, "AR · TP") is plain
