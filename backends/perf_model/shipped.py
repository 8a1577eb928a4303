"""The shipped default constants: the global fit over every validation source, per hardware
class (``fitted.yaml``, written by ``python bench/model_validation.py --write``). A node whose
class no source covered gets the physical priors for it."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

from backends.perf_model.catalog import load_hardware
from backends.perf_model.constants import Efficiency

FITTED = Path(__file__).parent / "fitted.yaml"


@cache
def _fitted() -> dict[str, float]:
    if not FITTED.is_file():
        return {}
    return dict((yaml.safe_load(FITTED.read_text()) or {}).get("constants") or {})


def default_efficiency(gpu: str, engine: str = "sglang") -> Efficiency:
    """The shipped constants for a node with this GPU running ``engine``."""
    hw = load_hardware(gpu)
    base = Efficiency(collective_latency_us=hw.collective_latency_us).as_dict()
    values = _fitted()
    chosen = {n: values[f"{n}@{k}"] for n, k in hw.classes(engine).items()
              if f"{n}@{k}" in values}
    return Efficiency(**{**base, **chosen})


def write_fitted(result, path: Path = FITTED) -> Path:
    """Store a FitResult's constants (and how well each is identified) as the shipped default."""
    lines = ["# Written by `python bench/model_validation.py --write`: the bounded global fit",
             "# over every validation source, one value per hardware class (constants.py).",
             "constants:"]
    lines += [f"  {key}: {value:.6g}" for key, value in sorted(result.values.items())]
    lines += ["identifiability:"]
    lines += [f"  {i.key}: {i.status!r}" for i in result.identified]
    path.write_text("\n".join(lines) + "\n")
    _fitted.cache_clear()
    return path
