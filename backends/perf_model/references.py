"""Reference measurements shipped with the project, and the model's predictor for calibration."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from backends.contract import Workload
from backends.deployment import Deployment, DrafterSpec
from backends.errors import UserError
from backends.flags import LaunchTarget
from backends.launch_params import LaunchParams
from backends.perf_model.backend import PerfModelBackend
from backends.perf_model.acceptance import profile_for_length
from backends.perf_model.calibrate import (
    METRICS,
    PEAK,
    PEAK_SECOND,
    SPEEDUP,
    Observation,
    Predictor,
)
from backends.perf_model.constants import Efficiency
from backends.perf_model.predict import prefill_free_tok_s

_DIR = Path(__file__).parent / "references"
VALIDATION_DIR = Path(__file__).parent / "validation"


@dataclass(slots=True, frozen=True)
class KvCheck:
    """A KV capacity an engine logged: ``tokens`` fit in ``kv_pool_gib`` per GPU (None: the
    engine logged no pool size; the model plans it from the launch's memory fraction)."""

    name: str
    launch: LaunchParams
    kv_pool_gib: float | None
    tokens: int


@dataclass(slots=True, frozen=True)
class Reference:
    deployment: Deployment
    workload: Workload
    observations: tuple[Observation, ...]
    kv_checks: tuple[KvCheck, ...] = ()
    source: str = ""  # where the numbers were read (validation sources cite it)
    name: str = ""
    group: str = ""  # files of one source (left out together); empty: the file is the source
    # Why the source is compared but never fitted (empty: it is fitted). For numbers no term of
    # the model describes (an engine's kernel pathology): fitting them would move every constant
    # they share with the other sources, so they are scored against the others' fit instead.
    not_fitted: str = ""

    @property
    def source_group(self) -> str:
        return self.group or self.name


def reference_names() -> list[str]:
    return sorted(p.stem for p in _DIR.glob("*.yaml"))


def validation_sources() -> list[Reference]:
    """Every published source the model is validated on: the shipped references (the user's
    node) and ``validation/*.yaml``, one file each."""
    paths = sorted(_DIR.glob("*.yaml")) + sorted(VALIDATION_DIR.glob("*.yaml"))
    return [load_reference(str(p)) for p in paths]


def fitted_sources(sources: list[Reference]) -> list[Reference]:
    """The sources a fit may use: all but those marked compared-only (``source.not_fitted``)."""
    return [s for s in sources if not s.not_fitted]


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
        return replace(_parse(raw), name=path.stem)
    except KeyError as err:
        raise UserError(f"{path}: missing key {err.args[0]!r} (format: docs/CALIBRATE.md)") \
            from None
    except (TypeError, AttributeError, ValueError) as err:  # ValueError: InvalidParams, ...
        raise UserError(f"{path}: {err} (format: docs/CALIBRATE.md)") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError(f"{path}: not valid YAML: {getattr(err, 'problem', None) or err}"
                        f"{where}") from None
    if not isinstance(raw, dict):
        what = "is empty" if raw is None else f"holds a {type(raw).__name__}, not a mapping"
        raise UserError(f"{path} {what}: a reference needs deployment, workload and "
                        "observations (format: docs/CALIBRATE.md)")
    for key, kind in (("deployment", dict), ("workload", dict), ("observations", list)):
        if not isinstance(raw.get(key), kind) or not raw[key]:
            raise UserError(f"{path}: {key} must be a non-empty "
                            f"{'mapping' if kind is dict else 'list'} (format: docs/CALIBRATE.md)")
    return raw


def _parse(raw: dict[str, Any]) -> Reference:
    dep = dict(raw["deployment"])
    drafter = dep.pop("drafter", None)
    deployment = Deployment(
        **dep, target=LaunchTarget(model_path="/models/target", drafter_path="/models/drafter"),
        drafter=drafter and _drafter(drafter))
    wl = raw["workload"]
    workload = Workload(wl["input_len"], wl["output_len"], tuple(wl["concurrency"]))
    defaults = raw.get("defaults") or {}
    observations = tuple(_observation(o, defaults, workload) for o in raw["observations"])
    kv = tuple(KvCheck(k["name"], LaunchParams.from_params({**defaults, **(k.get("params") or {})}),
                       _optional_float(k.get("kv_pool_gib")), int(k["tokens"]))
               for k in raw.get("kv_capacity") or ())
    source = raw.get("source") or {}
    return Reference(deployment, workload, observations, kv, str(source.get("cite", "")),
                     group=str(source.get("group", "")),
                     not_fitted=str(source.get("not_fitted", "")).strip())


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _drafter(raw: dict[str, Any]) -> DrafterSpec:
    """A drafter block; ``acceptance_length`` (the engines' mean accept length at the drafter's
    block size) may stand in for a per-position ``acceptance`` profile."""
    raw = dict(raw)
    if "acceptance_length" in raw:
        profile = profile_for_length(float(raw.pop("acceptance_length")), raw["block_size"])
        raw["acceptance"] = profile.top1
    return DrafterSpec(**_tuples(raw))


def _observation(o: Any, defaults: dict[str, Any], workload: Workload) -> Observation:
    if not isinstance(o, dict):
        raise UserError(f"each observation must be a mapping (name, at, output_tok_s, "
                        f"params), got {o!r}")
    if o["at"] != PEAK and o["at"] not in workload.concurrency:
        raise UserError(f"observation {o['name']!r}: at must be {PEAK!r} or one of the "
                        f"workload's concurrency levels {list(workload.concurrency)}, "
                        f"got {o['at']!r}")
    metric = o.get("metric", "output_tok_s")
    if metric not in METRICS:
        raise UserError(f"observation {o['name']!r}: metric must be one of {list(METRICS)}")
    value = o["value"] if "value" in o else o["output_tok_s"]
    params = LaunchParams.from_params({**defaults, **(o.get("params") or {})})
    baseline = None
    if metric == SPEEDUP:
        baseline = LaunchParams.from_params({**defaults, **(o.get("baseline") or {})})
    return Observation(o["name"], params, o["at"], float(value), metric, baseline,
                       str(o.get("compared", "")).strip())


def model_predictor(deployment: Deployment) -> Predictor:
    """An observation's metric predicted under given efficiency constants."""

    def predict(eff: Efficiency, obs: Observation, workload: Workload) -> float:
        backend = PerfModelBackend(deployment, eff)
        value = _level_metric(backend, obs.launch, workload, obs.at, obs.metric)
        if obs.baseline is None:
            return value
        base = _level_metric(backend, obs.baseline, workload, obs.at, "output_tok_s")
        return value / base if base else 0.0

    return predict


def _level_metric(backend: PerfModelBackend, launch: LaunchParams, workload: Workload,
                  at: int | str, metric: str) -> float:
    metric = "output_tok_s" if metric == SPEEDUP else metric
    if at != PEAK:
        workload = replace(workload, concurrency=(at,))
    rows = [m for m in backend.measure(launch, workload) if m.ok]
    if not rows:
        return 0.0
    if metric == PEAK_SECOND:
        return max(prefill_free_tok_s(m) for m in rows)
    best = max(rows, key=lambda m: m.output_tok_s)
    return float(getattr(best, metric) or 0.0)


def _tuples(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
