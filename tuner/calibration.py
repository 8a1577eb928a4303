"""``dflash-tune calibrate``: fit the model's constants and show how well they reproduce."""

from __future__ import annotations

from backends.perf_model.constants import Efficiency
from backends.perf_model.references import fit_reference
from backends.perf_model.references import load_reference
from tuner import render


def calibrate_reference(name: str) -> Efficiency:
    eff, comparisons = fit_reference(load_reference(name))
    rows = [(c.name, c.observed, c.predicted, f"{c.ratio:.2f}") for c in comparisons]
    render.table(f"model vs {name}", ["observation", "observed tok/s", "predicted", "ratio"], rows)
    render.note("paste under `backend.efficiency` in tuner.yaml:")
    render.emit("".join(f"{k}: {v:.4g}\n" for k, v in eff.as_dict().items()))
    return eff
