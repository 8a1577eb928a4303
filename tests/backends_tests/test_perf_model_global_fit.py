"""The bounded global fit: it recovers constants that generated the data, stays inside the
physical bounds, says which constants sit on a bound, and keeps classes apart."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from backends.perf_model.calibrate import Observation
from backends.perf_model.constants import BOUNDS, Efficiency
from backends.perf_model.global_fit import constants_of, fit_sources
from backends.perf_model.references import model_predictor

TRUTH = Efficiency(bandwidth_efficiency=0.7, collective_latency_us=40.0, launch_overhead_us=30.0,
                   matmul_fixed_us=0.3, compute_efficiency=0.7, spec_round_us=400.0)


def _synthetic(ref, truth: Efficiency):
    """The reference's observations, their values replaced by the model's under ``truth``."""
    predict = model_predictor(ref.deployment)
    obs = tuple(replace(o, value=predict(truth, o, ref.workload)) for o in ref.observations)
    return replace(ref, observations=obs)


@pytest.fixture(scope="module")
def recovered(pcie8_reference):
    data = _synthetic(pcie8_reference, TRUTH)
    return data, fit_sources([data], starts=2)


def test_fit_reproduces_data_the_model_generated(recovered):
    data, result = recovered
    eff = result.efficiency(data.deployment.gpu)
    predict = model_predictor(data.deployment)
    for o in data.observations:
        assert predict(eff, o, data.workload) == pytest.approx(o.value, rel=0.03), o.name


def test_fit_recovers_the_well_identified_constants(recovered):
    data, result = recovered
    identified = {i.key: i for i in result.identified}
    eff = result.efficiency(data.deployment.gpu)
    assert identified["launch_overhead_us@host"].status.startswith("identified")
    assert eff.launch_overhead_us == pytest.approx(TRUTH.launch_overhead_us, rel=0.15)
    assert eff.bandwidth_efficiency == pytest.approx(TRUTH.bandwidth_efficiency, rel=0.15)


def test_fit_stays_inside_the_declared_bounds(recovered):
    for i in recovered[1].identified:
        low, high = BOUNDS[i.key.split("@")[0]]
        assert low <= i.value <= high


def test_data_that_needs_a_constant_past_its_bound_is_reported_pinned(pcie8_reference):
    fast = Efficiency(bandwidth_efficiency=1.0, collective_latency_us=40.0,
                      launch_overhead_us=30.0, matmul_fixed_us=0.3)
    plain = replace(pcie8_reference, observations=tuple(
        o for o in pcie8_reference.observations if not o.launch.speculative))
    data = _synthetic(plain, fast)
    data = replace(data, observations=tuple(replace(o, value=o.value * 1.3)
                                            for o in data.observations))
    result = fit_sources([data], starts=1)
    assert "bandwidth_efficiency@gddr7" in result.pinned
    assert any(i.status == "AT BOUND" for i in result.identified)


def test_speculation_constants_are_not_fitted_without_speculative_observations(pcie8_reference):
    plain = replace(pcie8_reference, observations=tuple(
        o for o in pcie8_reference.observations if not o.launch.speculative))
    keys = {c.key for c in constants_of([plain])}
    assert not any(k.startswith("spec_") for k in keys)
    assert "collective_latency_us@pcie5" in keys


def test_pcie_and_nvlink_sources_get_their_own_collective_latency(pcie8_reference):
    nvlink = replace(pcie8_reference, deployment=replace(pcie8_reference.deployment,
                                                         gpu="h200-sxm"))
    keys = {c.key for c in constants_of([pcie8_reference, nvlink])}
    assert {"collective_latency_us@pcie5", "collective_latency_us@nvlink",
            "bandwidth_efficiency@gddr7", "bandwidth_efficiency@hbm3e"} <= keys


def test_a_speedup_observation_is_the_ratio_of_two_predictions(pcie8_reference):
    ref = pcie8_reference
    by_name = {o.name: o for o in ref.observations}
    dflash, plain = by_name["EP8 DFlash eager c1"], by_name["EP8 graphs c1"]
    speedup = Observation("s", dflash.launch, 1, 1.3, "speedup", plain.launch)
    predict = model_predictor(ref.deployment)
    eff = Efficiency()
    expected = predict(eff, dflash, ref.workload) / predict(eff, plain, ref.workload)
    assert predict(eff, speedup, ref.workload) == pytest.approx(expected)


def test_a_cpu_host_keeps_classes_and_bounds_of_its_own():
    """A CPU host's launches cost no CUDA launch: its launch overhead may sit below the GPU's
    3 us floor, and it is never shared with a GPU host's (nor its GEMM or small-op constants)."""
    from backends.perf_model.catalog import load_hardware
    from backends.perf_model.constants import bounds
    from backends.perf_model.global_fit import Constant

    cpu = load_hardware("cpu-2core-vm").classes("vllm")
    gpu = load_hardware("h200-sxm").classes("vllm")
    host_side = ("launch_overhead_us", "compute_efficiency")
    assert {cpu[n] for n in host_side} == {"cpu"} and gpu["launch_overhead_us"] == "host"
    engine_side = ("kernel_fixed_us", "spec_round_us", "spec_request_us")
    assert {cpu[n] for n in engine_side} == {"vllm-cpu"}
    assert {gpu[n] for n in engine_side} == {"vllm"}
    assert bounds("launch_overhead_us", "host") == BOUNDS["launch_overhead_us"]
    assert bounds("launch_overhead_us", "cpu")[0] < BOUNDS["launch_overhead_us"][0]
    assert bounds("spec_request_us", "vllm-cpu")[1] > BOUNDS["spec_request_us"][1]
    assert bounds("bandwidth_efficiency", "dram") == BOUNDS["bandwidth_efficiency"]
    # what the fitter searches within
    low, _ = Constant("launch_overhead_us", "cpu").x_bounds
    assert low == pytest.approx(math.log(bounds("launch_overhead_us", "cpu")[0]))


def test_the_screens_coordinate_fit_searches_a_cpu_hosts_own_bounds():
    """The launch-aware screen's local fit (calibrate.fit) honours the same per-class bounds: a
    CPU host's launch overhead may go below the GPU's 3 us floor, a GPU host's may not."""
    from backends.contract import Workload
    from backends.launch_params import LaunchParams
    from backends.perf_model.calibrate import fit

    def predict(eff, obs, workload):  # throughput set by the launch overhead alone
        return 1000.0 / eff.launch_overhead_us

    obs = [Observation("c1", LaunchParams(), 1, 1000.0)]  # wants 1 us
    start = Efficiency(launch_overhead_us=25.0)
    cpu = fit(predict, obs, Workload(8, 8, (1,)), start, names=("launch_overhead_us",),
              classes={"launch_overhead_us": "cpu"})
    gpu = fit(predict, obs, Workload(8, 8, (1,)), start, names=("launch_overhead_us",),
              classes={"launch_overhead_us": "host"})
    assert cpu.launch_overhead_us == pytest.approx(1.0, rel=0.05)
    assert BOUNDS["launch_overhead_us"][0] <= gpu.launch_overhead_us < 4.0
