"""Where speculation stops paying: the best speculative configuration over the best plain one at
each concurrency, a configuration measured several times by the median of its runs."""

from __future__ import annotations

import pytest
from made_study import curve_trial

from backends.perf_model.shipped import speedup_error
from tuner.config import load_config
from tuner.crossover import crossover
from tuner.crossover import envelopes
from tuner.crossover import fastest_at
from tuner.crossover import study_crossover

AR_TP = {"speculative_algorithm": "none", "tp_size": 8}
DFLASH_TP = {"speculative_algorithm": "dflash", "tp_size": 8}
DDTREE_EP = {"speculative_algorithm": "ddtree", "tp_size": 8, "ep_size": 8}


def test_crossover_is_where_speculation_stops_beating_plain_decoding():
    trials = [curve_trial(0, AR_TP, {1: 10, 16: 100, 128: 800}),
              curve_trial(1, DFLASH_TP, {1: 30, 16: 150, 128: 700}),
              curve_trial(2, DDTREE_EP, {1: 35, 16: 90, 128: 600})]
    curves = envelopes(trials)
    assert list(curves) == ["AR · TP", "DFlash · TP", "DDTree · EP"]
    cross = crossover(curves)
    assert cross.levels == [1, 16, 128] and cross.stops_at == 128
    assert cross.speedup[0] == pytest.approx(3.5)
    assert "from concurrency 128" in cross.note
    assert cross.line() == ("1: 3.50x · 16: 1.50x · 128: 0.88x; "
                            "speculation stops paying from concurrency 128")


def test_a_level_lost_before_speculation_pays_again_is_named():
    """DFlash on the reference node's MoE: at 4 requests its verify touches several times the
    experts a plain step does, so that one level loses; the gap narrows as more of them are
    touched either way, and speculation wins again."""
    dip = [curve_trial(0, AR_TP, {1: 80, 4: 260, 16: 400}),
           curve_trial(1, DFLASH_TP, {1: 140, 4: 250, 16: 520})]
    cross = crossover(envelopes(dip))
    assert cross.stops_at is None
    assert cross.note == "speculation beats plain decoding at every measured concurrency but 4"
    late = dip + [curve_trial(2, {**AR_TP, "tp_size": 4}, {64: 700}),
                  curve_trial(3, {**DFLASH_TP, "tp_size": 4}, {64: 650})]
    cross = crossover(envelopes(late))
    assert cross.stops_at == 64
    assert cross.note == "speculation stops paying from concurrency 64 (and loses at 4)"


def test_a_configuration_measured_again_counts_by_its_median_not_its_luckiest_run():
    """Finalists are relaunched: taking any run's best would favour the family relaunched most."""
    runs = [curve_trial(0, AR_TP, {1: 120}),
            curve_trial(1, DFLASH_TP, {1: 100}), curve_trial(2, DFLASH_TP, {1: 300}),
            curve_trial(3, DFLASH_TP, {1: 110}),
            curve_trial(4, {**DFLASH_TP, "speculative_dflash_block_size": 4}, {1: 500}, "crash"),
            curve_trial(5, {**DFLASH_TP, "ep_size": 3}, {1: 900})]  # 3 does not divide 8: no launch
    curves = envelopes(runs)
    assert curves == {"AR · TP": {1: 120}, "DFlash · TP": {1: 110}}
    cross = crossover(curves)
    assert cross.stops_at == 1 and cross.note == "speculation never beats plain decoding here"
    assert cross.as_dict() == {"by_concurrency": [{"concurrency": 1, "speedup": 110 / 120}],
                               "stops_paying_at": 1,
                               "note": "speculation never beats plain decoding here",
                               "caveat": "", "margin": 0.0, "within_error_from": None,
                               "within_error_at": [], "settle_at": None, "to_measure": []}


def test_without_both_kinds_there_is_nothing_to_compare():
    cross = crossover(envelopes([curve_trial(0, DFLASH_TP, {1: 30})]))
    assert cross.levels == [] and cross.stops_at is None
    assert cross.line() == "no successful plain (AR) configuration to compare with"


def test_a_real_engines_levels_are_said_to_be_sampled_for_the_target_only():
    """A measuring study launches configurations chosen for its target concurrency; its other
    levels are not searched (tuner/level_search.py runs on the performance model only)."""
    predicted = [curve_trial(0, AR_TP, {1: 10, 64: 500}),
                 curve_trial(1, DFLASH_TP, {1: 30, 64: 450})]
    measured = [curve_trial(t.trial_number, t.params, {1: 10 + t.trial_number, 64: 500},
                            predicted=False) for t in predicted]
    assert not any(t.engine_measured for t in predicted)
    assert all(t.engine_measured for t in measured)
    cross = crossover(envelopes(measured), sampled_for=64)
    assert cross.caveat == ("levels other than 64 show what configurations chosen for 64 "
                            "reached there, not a search of each")
    assert cross.line().endswith(f"from concurrency 64 ({cross.caveat})")
    assert crossover(envelopes(predicted)).caveat == ""
    # One level is its own target: nothing to qualify.
    assert crossover(envelopes([curve_trial(0, AR_TP, {64: 5}),
                                curve_trial(1, DFLASH_TP, {64: 6})]), 64).caveat == ""


def test_predicted_speedups_within_the_models_error_of_parity_are_too_close_to_call():
    """The performance model's speedups are as good as its error on published ones: where the
    gain has fallen inside that error and stays there, the note says so instead of a verdict."""
    falling = [curve_trial(0, AR_TP, {1: 100, 64: 600, 128: 800, 256: 900}),
               curve_trial(1, DFLASH_TP, {1: 160, 64: 720, 128: 840, 256: 960})]
    cross = crossover(envelopes(falling), margin=0.1)
    assert cross.stops_at is None and cross.within_error_from == 128
    assert cross.note == "speculation beats plain decoding at every measured concurrency"
    assert cross.caveat == ("from concurrency 128 on, the two are within the model's speedup "
                            "error of +-10%: measure there before relying on it")
    assert cross.line().endswith(f"at every measured concurrency ({cross.caveat})")
    assert cross.as_dict()["within_error_from"] == 128 and cross.as_dict()["margin"] == 0.1
    assert cross.within_error_at == [128, 256] and cross.settle_at == 128
    wide = crossover(envelopes(falling), margin=0.5)
    assert wide.within_error_from == 64 and wide.caveat.startswith("from concurrency 64 on,")
    assert crossover(envelopes(falling), margin=0.7).caveat.startswith(
        "at every level the two are within the model's speedup error of +-70%")
    # Parity read in ratio either way: 0.90 is a loss beyond 10% (1 / 1.1 = 0.909).
    lost = falling + [curve_trial(2, {**AR_TP, "tp_size": 4}, {512: 1000}),
                      curve_trial(3, {**DFLASH_TP, "tp_size": 4}, {512: 900})]
    cross = crossover(envelopes(lost), margin=0.1)
    assert cross.stops_at == 512 and cross.within_error_from is None
    assert cross.note == "speculation stops paying from concurrency 512"
    # The levels before the clear loss are still inside the error: they are named, not called.
    assert cross.caveat.startswith("at concurrency 128 and 256, the two are within")
    assert crossover(envelopes(falling), margin=0.0).within_error_from is None
    assert crossover(envelopes(falling)).note == (
        "speculation beats plain decoding at every measured concurrency")


def test_every_level_too_close_to_call_is_named_not_only_the_tail():
    """The reference node's MoE: at 4 requests a verify touches several times the experts a
    plain step does, so the gain there can dip inside the model's error while it is clear at
    16 and 32; that level is as uncertain as the tail and the caveat names it."""
    dip = [curve_trial(0, AR_TP, {1: 86, 4: 234, 16: 398, 32: 498, 128: 868, 256: 954}),
           curve_trial(1, DFLASH_TP, {1: 144, 4: 262, 16: 510, 32: 651, 128: 915, 256: 1020})]
    cross = crossover(envelopes(dip), margin=0.16)
    assert cross.within_error_at == [4, 128, 256] and cross.within_error_from == 128
    assert cross.caveat == ("at concurrency 4 and from concurrency 128 on, the two are within "
                            "the model's speedup error of +-16%: measure there before relying "
                            "on it")
    assert cross.settle_at == 128
    middle = [curve_trial(0, AR_TP, {1: 86, 4: 234, 8: 300, 16: 398}),
              curve_trial(1, DFLASH_TP, {1: 144, 4: 262, 8: 320, 16: 510})]
    alone = crossover(envelopes(middle), margin=0.16)
    assert alone.within_error_from is None and alone.within_error_at == [4, 8]
    assert alone.caveat.startswith("at concurrency 4 and 8, the two are within")
    assert alone.settle_at == 4
    assert alone.note == "speculation beats plain decoding at every measured concurrency"
    three = crossover(envelopes([*middle, curve_trial(2, AR_TP, {2: 150}),
                                 curve_trial(3, DFLASH_TP, {2: 160})]), margin=0.16)
    assert three.caveat.startswith("at concurrency 2, 4 and 8, the two")


def test_a_studys_crossover_carries_the_models_error_only_on_predicted_levels():
    predicted = [curve_trial(0, AR_TP, {1: 100, 64: 600}),
                 curve_trial(1, DFLASH_TP, {1: 160, 64: 630})]
    measured = [curve_trial(t.trial_number, t.params,
                            {c: m["output_tok_s"] for c, m in t.measurements.items()},
                            predicted=False) for t in predicted]
    cfg = load_config(None)  # the reference node, target 64, measured kernels
    model = study_crossover(predicted, cfg)
    assert (model.margin, model.within_error_from) == (speedup_error(measured_kernels=True), 64)
    assert model.caveat.startswith("from concurrency 64 on, the two are within")
    assert model.to_measure == [(0, predicted[0].launch.label()),
                                (1, predicted[1].launch.label())]
    engine = study_crossover(measured, cfg)
    assert (engine.margin, engine.within_error_from, engine.to_measure) == (0.0, None, [])
    assert engine.caveat.startswith("levels other than 64")
    assert engine.speedup == model.speedup


def test_a_launch_aware_studys_levels_are_said_to_be_where_its_searches_went():
    """Each launch searches its own SLA limit: its levels are where that search measured
    (71, 72, ...), neither the target nor a sweep of each configuration."""
    measured = [curve_trial(0, AR_TP, {1: 58, 71: 628, 72: 689}, predicted=False),
                curve_trial(1, DFLASH_TP, {1: 140, 71: 768, 72: 722}, predicted=False)]
    cfg = load_config(None, {"tuning.strategy": "launch_aware", "backend.name": "simulated"})
    cross = study_crossover(measured, cfg)
    assert cross.levels == [1, 71, 72] and cross.margin == 0.0
    assert cross.caveat == ("each level is one where some launch's search for its own SLA "
                            "limit measured, not a sweep of each configuration")
    one = study_crossover([curve_trial(0, AR_TP, {1: 58}, predicted=False),
                           curve_trial(1, DFLASH_TP, {1: 140}, predicted=False)], cfg)
    assert one.caveat.startswith("each level is one where")


def test_what_to_measure_is_the_fastest_plain_and_speculative_configuration_at_the_level():
    """By each configuration's median at that level, not its luckiest run or another level."""
    ar_fast_early = {**AR_TP, "max_running_requests": 32}
    ar_fast_late = {**AR_TP, "max_running_requests": 256}
    trials = [curve_trial(0, ar_fast_early, {1: 100, 128: 500}),
              curve_trial(1, ar_fast_late, {1: 90, 128: 800}),
              curve_trial(2, DFLASH_TP, {1: 160, 128: 700}),
              curve_trial(3, DFLASH_TP, {1: 160, 128: 1000}),
              curve_trial(4, DFLASH_TP, {1: 160, 128: 820}),
              curve_trial(5, DDTREE_EP, {1: 150, 128: 810})]
    assert [t.trial_number for t in fastest_at(trials, 128)] == [1, 2]
    assert [t.trial_number for t in fastest_at(trials, 1)] == [0, 2]
    assert fastest_at(trials[:1], 128)[0].trial_number == 0  # no speculative one: plain alone
