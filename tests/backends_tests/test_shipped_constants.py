"""The shipped constants: what `bench/model_validation.py --write` stores is what the model
backend and the crossover read back."""

from __future__ import annotations

import pytest

from backends.perf_model import shipped
from backends.perf_model.global_fit import FitResult
from backends.perf_model.global_fit import Identified


def test_a_written_fit_is_read_back_with_its_speedup_error(tmp_path, monkeypatch):
    monkeypatch.setattr(shipped, "FITTED_MEASURED", tmp_path / "fitted_measured.yaml")
    fit = FitResult(values={"launch_overhead_us@host": 31.5}, loss=0.5, starts=1,
                    identified=[Identified("launch_overhead_us@host", 31.5, 1.0, 200.0, 0.1,
                                           False)])
    shipped.write_fitted(fit, shipped.fitted_path(True), speedup_error=0.1234)
    assert shipped.speedup_error(True) == 0.1234
    efficiency = shipped.default_efficiency("rtx-pro-6000-server", "sglang", True)
    assert efficiency.launch_overhead_us == 31.5
    shipped.write_fitted(fit, shipped.fitted_path(True))  # a fit without a validation's error
    assert shipped.speedup_error(True) == 0.0


@pytest.mark.parametrize("measured_kernels", [True, False])
def test_both_shipped_fits_record_the_models_speedup_error(measured_kernels):
    """Each was written by a validation run that also scored the published speedups."""
    assert 0.01 < shipped.speedup_error(measured_kernels) < 0.5
