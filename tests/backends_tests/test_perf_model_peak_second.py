"""A load test's peak one-second output (``peak_output_tok_s``) as the model predicts it: the
running batch's decode rate, which prompts (prefilled between decode steps) lower for the run's
average but not for a second in which none is prefilled."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.contract import Workload
from backends.launch_params import LaunchParams
from backends.perf_model.backend import PerfModelBackend
from backends.perf_model.calibrate import PEAK, PEAK_SECOND
from backends.perf_model.predict import prefill_free_tok_s
from backends.perf_model.references import model_predictor
from backends.perf_model.shipped import default_efficiency

EP8 = LaunchParams.from_params({"tp_size": 8, "ep_size": 8, "cuda_graph": True,
                                "cuda_graph_max_bs": 256, "max_running_requests": 256})


def _level(deployment, input_len: int, concurrency: int):
    backend = PerfModelBackend(deployment, default_efficiency(deployment.gpu, "sglang",
                                                              deployment.measured_kernels))
    [m] = backend.measure(EP8, Workload(input_len, 512, (concurrency,)))
    return m


@pytest.mark.parametrize("measured", [False, True], ids=["roofline", "measured-kernels"])
def test_longer_prompts_cut_the_run_average_far_more_than_the_peak_second(pcie8_reference,
                                                                          measured):
    dep = replace(pcie8_reference.deployment, measured_kernels=measured)
    short, long = (_level(dep, n, 32) for n in (256, 4096))
    assert prefill_free_tok_s(short) > short.output_tok_s
    average_lost = 1 - long.output_tok_s / short.output_tok_s
    peak_kept = prefill_free_tok_s(long) / prefill_free_tok_s(short)
    assert average_lost > 2 * (1 - peak_kept)
    # Only attention over the longer context slows the peak second.
    assert peak_kept > 0.7


def test_the_peak_second_is_the_running_batch_over_one_decode_step(pcie8_reference):
    m = _level(pcie8_reference.deployment, 1024, 64)
    decode_ms = sum(v for k, v in m.breakdown_ms.items() if k != "prefill_share")
    assert prefill_free_tok_s(m) == pytest.approx(64 * 1e3 / decode_ms)


def test_the_reference_reads_its_four_peaks_as_peak_seconds_and_fits_them(pcie8_reference):
    peaks = [o for o in pcie8_reference.observations if o.at == PEAK]
    assert {o.name for o in peaks} == {"TP8 graphs peak", "EP4 graphs peak", "EP8 graphs peak",
                                       "EP8 DFlash eager peak"}
    assert all(o.metric == PEAK_SECOND and o.fitted for o in peaks)
    predict = model_predictor(pcie8_reference.deployment)
    eff = default_efficiency(pcie8_reference.deployment.gpu, "sglang", False)
    ep8 = next(o for o in peaks if o.name == "EP8 graphs peak")
    as_average = replace(ep8, metric="output_tok_s")
    assert predict(eff, ep8, pcie8_reference.workload) > predict(eff, as_average,
                                                                 pcie8_reference.workload)
