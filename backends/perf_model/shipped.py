"""The shipped default constants: the global fit over every validation source, per hardware
class, one fit for each way the model prices kernels: ``fitted.yaml`` for the roofline
(``python bench/model_validation.py --write``) and ``fitted_measured.yaml`` for the measured
kernel tables (``... --measured-kernels --write``). A node whose class no source covered gets
the physical priors for it."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

from backends.perf_model.catalog import load_hardware
from backends.perf_model.constants import Efficiency
from backends.perf_model.kernels.tables import data_root

FITTED = Path(__file__).parent / "fitted.yaml"
FITTED_MEASURED = Path(__file__).parent / "fitted_measured.yaml"


def fitted_path(measured_kernels: bool) -> Path:
    return FITTED_MEASURED if measured_kernels else FITTED


@cache
def _shipped(path: Path) -> dict:
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def _fitted(path: Path) -> dict[str, float]:
    return dict(_shipped(path).get("constants") or {})


def speedup_error(measured_kernels: bool) -> float:
    """How far the model's speedup of speculation over plain decoding typically lands from a
    published one it was not fitted on (relative; 0 where no validation run recorded it)."""
    return float(_shipped(fitted_path(measured_kernels)).get("speedup_error") or 0.0)


def measured_kernels_for(gpu: str, chosen: bool | None = None) -> bool:
    """Whether the model prices kernels from measured tables: as ``chosen``, else wherever the
    GPU has them (hardware.yaml ``measured_system``, the tables installed)."""
    if chosen is not None:
        return chosen
    return bool(load_hardware(gpu).measured_system) and data_root() is not None


def default_efficiency(gpu: str, engine: str = "sglang",
                       measured_kernels: bool = False) -> Efficiency:
    """The shipped constants for a node with this GPU running ``engine``, for the roofline or
    the measured kernel tables."""
    hw = load_hardware(gpu)
    base = Efficiency(collective_latency_us=hw.collective_latency_us).as_dict()
    values = _fitted(fitted_path(measured_kernels))
    chosen = {n: values[f"{n}@{k}"] for n, k in hw.classes(engine).items()
              if f"{n}@{k}" in values}
    return Efficiency(**{**base, **chosen})


def write_fitted(result, path: Path = FITTED, speedup_error: float | None = None) -> Path:
    """Store a FitResult's constants (and how well each is identified) as the shipped default,
    with the validation's ``speedup_error`` where given."""
    lines = ["# Written by `python bench/model_validation.py --write` (with --measured-kernels:",
             "# fitted_measured.yaml): the bounded global fit over every validation source,",
             "# one value per hardware class (constants.py)."]
    if speedup_error is not None:
        lines += ["# speedup_error: the median relative error of the published speedups over",
                  "# plain decoding, each source predicted without its own points.",
                  f"speedup_error: {speedup_error:.4f}"]
    lines += ["constants:"]
    lines += [f"  {key}: {value:.6g}" for key, value in sorted(result.values.items())]
    lines += ["identifiability:"]
    lines += [f"  {i.key}: {i.status!r}" for i in result.identified]
    path.write_text("\n".join(lines) + "\n")
    _shipped.cache_clear()
    return path
