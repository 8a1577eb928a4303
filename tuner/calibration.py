"""``dflash-tune calibrate``: fit the model's constants and show how well they reproduce."""

from __future__ import annotations

from backends.perf_model.calibrate import compare
from backends.perf_model.calibrate import fit
from backends.perf_model.catalog import load_hardware
from backends.perf_model.constants import Efficiency
from backends.perf_model.references import load_reference
from backends.perf_model.references import model_predictor
from tuner import render


def calibrate_reference(name: str) -> Efficiency:
    ref = load_reference(name)
    predict = model_predictor(ref.deployment)
    start = Efficiency(collective_latency_us=load_hardware(ref.deployment.gpu).collective_latency_us)
    eff = fit(predict, ref.observations, ref.workload, start)
    rows = [(c.name, c.observed, c.predicted, f"{c.ratio:.2f}")
            for c in compare(predict, eff, ref.observations, ref.workload)]
    render.table(f"model vs {name}", ["observation", "observed tok/s", "predicted", "ratio"], rows)
    render.note("paste under `backend.efficiency` in tuner.yaml:")
    render.emit("".join(f"{k}: {v:.4g}\n" for k, v in eff.as_dict().items()))
    return eff
