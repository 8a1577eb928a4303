"""``dflash-tune compare``: two studies' best configurations side by side (two machines, e.g. a
PCIe node and an H200 one, or one machine before and after an upgrade).

Each study is judged as ``best`` judges it (its own SLA unless ``--sla`` is given, its own
engine). :func:`overlay_data` gives both studies' trials and choices for a dashboard overlay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner import records
from tuner import render
from tuner.best import BestResult
from tuner.best import find_best
from tuner.best import open_records
from tuner.config import Config
from tuner.errors import NoResultError
from tuner.export import trial_dicts

# (label, key of BestResult.view), in table order.
ROWS = (("output tok/s (total)", "output_tok_s"), ("output tok/s per GPU", "output_tok_s_per_gpu"),
        ("TTFT p50 ms", "ttft_p50_ms"), ("TTFT p99 ms", "ttft_p99_ms"),
        ("TPOT p50 ms", "tpot_p50_ms"), ("TPOT p99 ms", "tpot_p99_ms"),
        ("tok/s per user", "tok_s_per_user"), ("tok/s per user @1", "tok_s_per_user_at_1"),
        ("vs plain", "speedup_vs_plain"), ("read at concurrency", "read_at_concurrency"),
        ("runs", "runs"))


@dataclass(slots=True)
class Side:
    study: str
    storage: str
    result: BestResult

    def as_dict(self) -> dict[str, Any]:
        r = self.result
        return {"study": self.study, "storage": self.storage, "hardware": r.hardware,
                "engine": r.engine, "sla": [str(limit) for limit in r.limits],
                "best": r.view(r.chosen), "front": [r.view(c) for c in r.front[:r.top]],
                "warnings": r.warnings}


def compare_studies(cfg: Config, study_a: str, study_b: str, storage_b: str | None = None,
                    sla: list[str] | None = None) -> tuple[Side, Side]:
    """Both studies' best; ``study_b`` is read from ``storage_b`` (default: ``cfg``'s DB)."""
    return (_side(cfg, study_a, cfg.study.storage, sla),
            _side(cfg, study_b, storage_b or cfg.study.storage, sla))


def overlay_data(cfg: Config, study_a: str, study_b: str,
                 storage_b: str | None = None) -> dict[str, Any]:
    """Both studies' choice and every trial (as the JSON export nests them), for a view that
    draws the two over each other."""
    out = {}
    for key, side in zip(("a", "b"), compare_studies(cfg, study_a, study_b, storage_b)):
        db, _ = open_records(side.storage, side.study)
        out[key] = {**side.as_dict(),
                    "trials": trial_dicts(side.study, records.load_trials(db, side.study))}
    return out


def comparison_dict(a: Side, b: Side) -> dict[str, Any]:
    ratios = {key: _ratio(a.result, b.result, key) for _, key in ROWS}
    return {"a": a.as_dict(), "b": b.as_dict(),
            "b_over_a": {k: v for k, v in ratios.items() if v is not None}}


def show_comparison(a: Side, b: Side) -> None:
    va, vb = a.result.view(a.result.chosen), b.result.view(b.result.chosen)
    rows = [("study", a.study, b.study, ""),
            ("hardware", a.result.hardware, b.result.hardware, ""),
            ("engine", a.result.engine, b.result.engine, ""),
            ("trial", va["trial"], vb["trial"], ""),
            ("configuration", va["configuration"], vb["configuration"], "")]
    for label, key in ROWS:
        ratio = _ratio(a.result, b.result, key)
        rows.append((label, va[key], vb[key], f"{ratio:.2f}x" if ratio is not None else ""))
    rows.append(("queues", _yes(va["queueing"]), _yes(vb["queueing"]), ""))
    rows.append(("SLA", ", ".join(map(str, a.result.limits)),
                 ", ".join(map(str, b.result.limits)), ""))
    render.table("Best configuration of each study", ["", "A", "B", "B / A"], rows)
    for side in (a, b):
        for warning in side.result.warnings:
            render.note(f"warning ({side.study}): {warning}", "yellow")


def _side(cfg: Config, study: str, storage: str, sla: list[str] | None) -> Side:
    one = cfg.model_copy(update={"study": cfg.study.model_copy(
        update={"name": study, "storage": storage})})
    try:
        return Side(study, storage, find_best(one, None, sla))
    except NoResultError as err:
        raise NoResultError(f"study {study!r}: {err}") from None


def _ratio(a: BestResult, b: BestResult, key: str) -> float | None:
    if key in ("read_at_concurrency", "runs"):
        return None
    x, y = a.view(a.chosen)[key], b.view(b.chosen)[key]
    return y / x if isinstance(x, int | float) and isinstance(y, int | float) and x else None


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
