"""``dflash-tune calibrate``: fit the model's constants and show how well they reproduce.

On a shipped reference (or a reference YAML), or on a study's own measured levels
(``--study``), optionally holding out part of the study's launches to see how well a fit on the
rest predicts them; ``--write`` stores the constants where ``run`` reads them.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from backends.perf_model.calibrate import Comparison, Observation, compare
from backends.perf_model.constants import Efficiency
from backends.perf_model.global_fit import fit_reference
from backends.perf_model.references import Reference, load_reference
from backends.perf_model.references import model_predictor
from tuner import render
from tuner.config import Config
from tuner.errors import UsageError

WITHIN = 0.25  # the target: a held-out level predicted within +-25%


def calibrate_reference(name: str, cfg: Config) -> Efficiency:
    """Fit to a reference, pricing kernels as ``run`` would for its GPU under ``cfg``: the
    measured tables wherever the GPU has them, unless the config says otherwise."""
    from backends.perf_model.shipped import measured_kernels_for

    ref = load_reference(name)
    measured = measured_kernels_for(ref.deployment.gpu, cfg.backend.measured_kernels)
    ref = replace(ref, deployment=replace(ref.deployment, measured_kernels=measured))
    eff, comparisons = fit_reference(ref)
    _show(f"model vs {name}", comparisons)
    _emit(eff)
    return eff


def calibrate_study(cfg: Config, holdout: float = 0.0) -> Efficiency:
    """Fit on the study's measured levels (every launch, or all but the held-out share of its
    trials, every ``1/holdout``-th by trial number) and compare."""
    cfg, trials = _measured_trials(cfg)
    render.note(f"fitting the model's constants to {len(trials)} measured launches of study "
                f"{cfg.study.name!r} (each start of the fit takes a while)")
    with render.stage_progress() as update:
        def progress(done: int, total: int, cost: float | None) -> None:
            update("fit starts", done, total, cost)

        eff, result, fitted, held = fit_study(cfg, holdout, trials, progress)
    _show(f"model vs study {cfg.study.name} (fitted levels)", fitted)
    if held:
        _show(f"held-out launches ({len(held)} levels, not fitted)", held)
    render.note(f"fitted levels:   {summary(fitted)}")
    if held:
        render.note(f"held-out levels: {summary(held)}")
    for line in repeat_spreads(trials):
        render.note(line)
    for i in result.identified:
        render.note(f"{i.key}: {i.value:.4g} ({i.status})",
                    "yellow" if i.at_bound else "")
    _emit(eff)
    return eff


def fit_study(cfg: Config, holdout: float = 0.0, trials: list | None = None, progress=None):
    """(constants, the FitResult, comparisons on the fitted levels, on the held-out ones), from
    `trials` (default: the study's measured ones, and then the study's own configuration in
    place of ``cfg``); ``progress`` as global_fit.fit_sources takes it.
    The drafter's acceptance is fitted first, to the fitted launches' measured accept lengths
    (acceptance_fit), so the constants do not absorb the drafter's error."""
    from backends.perf_model.acceptance_fit import fit_acceptance
    from backends.perf_model.global_fit import fit_sources
    from tuner.wiring import deployment_from, efficiency_from, workload_from

    if trials is None:
        cfg, trials = _measured_trials(cfg)
    fit_trials, held_trials = _split(trials, holdout)
    fit_obs, held = _observations(fit_trials), _observations(held_trials)
    if not fit_obs:
        raise UsageError(f"study {cfg.study.name!r} has no successful measured level to fit")
    workload = workload_from(cfg)
    dep = fit_acceptance(deployment_from(cfg), efficiency_from(cfg), workload,
                         [(t.launch, row.get("accept_len_mean")) for t in fit_trials
                          for row in t.measurements.values()])
    result = fit_sources([Reference(dep, workload, tuple(fit_obs), name=cfg.study.name)],
                         progress=progress)
    eff = result.efficiency(dep.gpu, dep.engine, fallback=efficiency_from(cfg))
    predict = model_predictor(dep)
    return (eff, result, compare(predict, eff, fit_obs, workload),
            compare(predict, eff, held, workload))


def summary(rows: list[Comparison]) -> str:
    """How many fitted-metric comparisons are within ``WITHIN``, their median and extremes."""
    ratios = [c.ratio for c in rows if c.fitted]
    if not ratios:
        return "none"
    errors = [abs(r - 1) for r in ratios]
    within = sum(e <= WITHIN for e in errors)
    return (f"{within}/{len(ratios)} within {WITHIN:.0%}, median |ratio - 1| "
            f"{statistics.median(errors):.2f}, worst {min(ratios):.2f} .. {max(ratios):.2f}")


def repeat_spreads(trials: list) -> list[str]:
    """The noise floor: each configuration measured in more than one launch, with its output
    tok/s range per level, the largest max / min over all of them, and how often one launch of a
    configuration, taken as the prediction of another's level, lands within ``WITHIN`` (what a
    model predicting held-out launches is up against)."""
    groups: dict[str, list] = {}
    for t in trials:
        key = " ".join(f"{k}={v}" for k, v in sorted(t.params.items()))
        groups.setdefault(key, []).append(t)
    lines, ratios = [], []
    for key, group in groups.items():
        if len(group) < 2:
            continue
        spans = []
        for level in sorted(set().union(*(t.measurements for t in group))):
            values = [t.measurements[level]["output_tok_s"] for t in group
                      if (t.measurements.get(level) or {}).get("output_tok_s")]
            if len(values) > 1:
                ratios += [a / b for i, a in enumerate(values)
                           for j, b in enumerate(values) if i != j]
                spans.append(f"c{level} {min(values):.4g}-{max(values):.4g}")
        lines.append(f"  {key} x{len(group)}: {', '.join(spans)}")
    if not ratios:
        return ["no configuration was measured in more than one launch (no noise floor)"]
    errors = [abs(r - 1) for r in ratios]
    return [f"same configuration in fresh launches: up to {max(ratios):.2f}x apart; one launch "
            f"as the prediction of another: {sum(e <= WITHIN for e in errors)}/{len(errors)} "
            f"level pairs within {WITHIN:.0%}, median |ratio - 1| "
            f"{statistics.median(errors):.2f}", *lines]


def _measured_trials(cfg: Config) -> tuple[Config, list]:
    """The configuration the study ran with (its deployment, workload and constants, whatever
    ./tuner.yaml says now) and its successful measured trials."""
    from tuner import records
    from tuner.best import open_records, study_config

    db, stored = open_records(cfg.study.storage, cfg.study.name)
    run_cfg = study_config(stored, cfg.study.storage, cfg.study.name)
    run_cfg.study = run_cfg.study.model_copy(
        update={"storage": cfg.study.storage, "name": cfg.study.name})
    return run_cfg, [t for t in records.load_trials(db, cfg.study.name)
                     if t.ok and t.measured and t.launch is not None]


def _split(trials: list, holdout: float) -> tuple[list, list]:
    """(fitted, held-out) trials: every ``1/holdout``-th by trial order is held out."""
    every = round(1 / holdout) if holdout > 0 else 0
    held_out = [bool(every) and i % every == every - 1 for i in range(len(trials))]
    return ([t for t, out in zip(trials, held_out) if not out],
            [t for t, out in zip(trials, held_out) if out])


def _observations(trials: list) -> list[Observation]:
    return [Observation(f"trial {t.trial_number} c{level}", t.launch, level,
                        float(row["output_tok_s"]))
            for t in trials for level, row in sorted(t.measurements.items())
            if row.get("failure") is None and (row.get("output_tok_s") or 0) > 0]


def write_efficiency(path: Path, eff: Efficiency) -> None:
    """Put ``eff`` under ``backend.efficiency`` in a tuner.yaml, leaving every other line (and
    its comments) as it is; a file without a backend section gets one."""
    block = ["  efficiency:"] + [f"    {k}: {v:.6g}" for k, v in eff.as_dict().items()]
    lines = path.read_text().splitlines() if path.is_file() else []
    start = next((i for i, line in enumerate(lines) if line.rstrip() == "backend:"), None)
    if start is None:
        lines += ["backend:", *block]
    else:
        end = next((i for i in range(start + 1, len(lines))
                    if lines[i] and not lines[i].startswith(" ")), len(lines))
        old = next((i for i in range(start + 1, end)
                    if lines[i].lstrip().startswith("efficiency:")
                    and lines[i].startswith("  ") and not lines[i].startswith("   ")), None)
        if old is None:
            lines[start + 1:start + 1] = block
        else:
            stop = next((i for i in range(old + 1, end)
                         if not lines[i].startswith("    ")), end)
            lines[old:stop] = block
    path.write_text("\n".join(lines) + "\n")


def _show(title: str, rows: list[Comparison]) -> None:
    table = [(c.name, c.metric, f"{c.observed:.4g}", f"{c.predicted:.4g}", f"{c.ratio:.2f}")
             for c in rows]
    render.table(title, ["observation", "metric", "observed", "predicted", "ratio"], table)


def _emit(eff: Efficiency) -> None:
    render.note("paste under `backend.efficiency` in tuner.yaml (or use --write):")
    render.emit("".join(f"{k}: {v:.4g}\n" for k, v in eff.as_dict().items()))
