"""A study written straight into a results DB: chosen numbers, so a test knows what `best`,
`--schedule`, `export` and `compare` must say about it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cli_helpers import write_config

from backends import Measurement
from tuner import records
from tuner.config import load_config
from tuner.params import parse

LEVELS = (1, 4, 128)


def level(concurrency: int, tok_s: float, tpot: float = 20.0, ttft: float = 300.0,
          gpus: int = 8) -> Measurement:
    return Measurement(concurrency=concurrency, output_tok_s=tok_s,
                       output_tok_s_per_gpu=tok_s / gpus, tok_s_per_user=tok_s / concurrency,
                       ttft_p50_ms=ttft, ttft_p99_ms=ttft * 1.5, tpot_p50_ms=tpot,
                       tpot_p99_ms=tpot * 1.2, predicted=True)


def trial(params: dict[str, Any], at_128: Measurement, single: float = 100.0,
          status: str = "ok") -> tuple[dict[str, Any], list[Measurement], str]:
    """A trial's params and levels: 1 and 4 from ``single`` tok/s per user, 128 as given."""
    gpus = params.get("tp_size", 8) * params.get("dp_size", 1)
    return params, [level(1, single, gpus=gpus), level(4, 3 * single, gpus=gpus), at_128], status


def curve_trial(number: int, params: dict[str, Any], curve: dict[int, float],
                status: str = "ok", predicted: bool = True) -> records.TrialRecord:
    """A trial record of ``params`` with these output tok/s by level, as ``best`` loads it."""
    return records.TrialRecord(
        trial_number=number, backend="model", params=params, status=status, measured=True,
        command="", env={}, log_excerpt="", launch=parse(params)[0],
        measurements={c: {"output_tok_s": v, "predicted": predicted} for c, v in curve.items()})


def make_study(folder: Path, trials: list[tuple[dict, list[Measurement], str]],
               name: str = "made", **sections: dict[str, Any]) -> Path:
    """A tuner.yaml in ``folder`` naming study ``name`` in folder/results.db, holding
    ``trials`` (numbered from 0) as a model-backend study would store them."""
    workload = {"target_concurrency": 128, **sections.pop("workload", {})}
    path = write_config(folder, study={"name": name}, workload=workload, **sections)
    cfg = load_config(path)
    add_study(cfg.study.storage, name, cfg.model_dump(mode="json"), trials)
    return path


def add_study(url: str, name: str, config: dict[str, Any],
              trials: list[tuple[dict, list[Measurement], str]]) -> None:
    db = records.connect(url)
    records.save_study_config(db, name, config)
    for number, (params, rows, status) in enumerate(trials):
        record = records.TrialRecord(number, "model", params, status, True, "", {}, "", {})
        records.save_trial(db, name, record, rows if status == "ok" else [])
    db.dispose()
