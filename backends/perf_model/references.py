"""Reference measurements shipped with the project, and the model's predictor for calibration."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from backends.contract import Workload
from backends.deployment import Deployment, DrafterSpec
from backends.flags import LaunchTarget
from backends.launch_params import LaunchParams
from backends.perf_model.backend import PerfModelBackend
from backends.perf_model.calibrate import PEAK, Comparison, Observation, Predictor, compare, fit
from backends.perf_model.catalog import load_hardware
from backends.perf_model.constants import Efficiency

_DIR = Path(__file__).parent / "references"


@dataclass(slots=True, frozen=True)
class Reference:
    deployment: Deployment
    workload: Workload
    observations: tuple[Observation, ...]


def reference_names() -> list[str]:
    return sorted(p.stem for p in _DIR.glob("*.yaml"))


def load_reference(name_or_path: str) -> Reference:
    """A shipped reference by name, or a reference YAML file (format: docs/CALIBRATE.md). A file
    that is not one is a ValueError of one line naming the file and what is wrong."""
    path = Path(name_or_path)
    if not path.is_file():
        path = _DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no reference {name_or_path!r}; shipped: {reference_names()}")
    raw = _read_yaml(path)
    try:
        return _parse(raw)
    except KeyError as err:
        raise ValueError(f"{path}: missing key {err.args[0]!r} (format: docs/CALIBRATE.md)") \
            from None
    except (TypeError, AttributeError, ValueError) as err:  # ValueError: InvalidParams, ...
        raise ValueError(f"{path}: {err} (format: docs/CALIBRATE.md)") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValueError(f"{path}: not valid YAML: {getattr(err, 'problem', None) or err}"
                         f"{where}") from None
    if not isinstance(raw, dict):
        what = "is empty" if raw is None else f"holds a {type(raw).__name__}, not a mapping"
        raise ValueError(f"{path} {what}: a reference needs deployment, workload and "
                         "observations (format: docs/CALIBRATE.md)")
    for key, kind in (("deployment", dict), ("workload", dict), ("observations", list)):
        if not isinstance(raw.get(key), kind) or not raw[key]:
            raise ValueError(f"{path}: {key} must be a non-empty "
                             f"{'mapping' if kind is dict else 'list'} (format: docs/CALIBRATE.md)")
    return raw


def _parse(raw: dict[str, Any]) -> Reference:
    dep = dict(raw["deployment"])
    drafter = dep.pop("drafter", None)
    deployment = Deployment(
        **dep, target=LaunchTarget(model_path="/models/target", drafter_path="/models/drafter"),
        drafter=drafter and DrafterSpec(**_tuples(drafter)))
    wl = raw["workload"]
    workload = Workload(wl["input_len"], wl["output_len"], tuple(wl["concurrency"]))
    defaults = raw.get("defaults") or {}
    observations = tuple(_observation(o, defaults, workload) for o in raw["observations"])
    return Reference(deployment, workload, observations)


def _observation(o: Any, defaults: dict[str, Any], workload: Workload) -> Observation:
    if not isinstance(o, dict):
        raise ValueError(f"each observation must be a mapping (name, at, output_tok_s, "
                         f"params), got {o!r}")
    if o["at"] != PEAK and o["at"] not in workload.concurrency:
        raise ValueError(f"observation {o['name']!r}: at must be {PEAK!r} or one of the "
                         f"workload's concurrency levels {list(workload.concurrency)}, "
                         f"got {o['at']!r}")
    params = LaunchParams.from_params({**defaults, **(o.get("params") or {})})
    return Observation(o["name"], params, o["at"], float(o["output_tok_s"]))


def model_predictor(deployment: Deployment) -> Predictor:
    """Predicted output tok/s of an observation under given efficiency constants."""

    def predict(eff: Efficiency, obs: Observation, workload: Workload) -> float:
        rows = PerfModelBackend(deployment, eff).measure(obs.launch, workload)
        by_level = {m.concurrency: m.output_tok_s for m in rows if m.ok}
        if not by_level:
            return 0.0
        return max(by_level.values()) if obs.at == PEAK else by_level.get(obs.at, 0.0)

    return predict


def fit_reference(ref: Reference) -> tuple[Efficiency, list[Comparison]]:
    """Constants fitted to ``ref`` (from neutral values and the interconnect's latency) and how
    each observation compares under them."""
    predict = model_predictor(ref.deployment)
    hw = load_hardware(ref.deployment.gpu)
    start = Efficiency(collective_latency_us=hw.collective_latency_us)
    eff = fit(predict, ref.observations, ref.workload, start)
    return eff, compare(predict, eff, ref.observations, ref.workload)


def _tuples(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
