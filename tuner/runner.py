"""``dflash-tune run``: one Optuna study over the search space, recorded in the results DB."""

from __future__ import annotations

from dataclasses import fields

from backends.launch_params import LaunchParams
from search_spaces import load_space
from tuner import records
from tuner import render
from tuner.config import Config
from tuner.interrupt import graceful_interrupt
from tuner.objective import Objective
from tuner.objective import TransientFailure
from tuner.study import enqueue_baseline
from tuner.study import measured_trials
from tuner.study import open_study
from tuner.study import run_trials
from tuner.wiring import backend_from
from tuner.wiring import space_context
from tuner.wiring import workload_from

LAUNCH_PARAM_NAMES = frozenset(f.name for f in fields(LaunchParams))


def run_study(cfg: Config) -> int:
    """Run until the study holds ``n_trials`` measured trials; returns how many ran now."""
    # Everything that can be wrong with the config fails here, before the DB is touched.
    space = load_space(cfg.search_space, known_params=LAUNCH_PARAM_NAMES)
    backend, context = backend_from(cfg), space_context(cfg)
    engine = records.connect(cfg.study.storage)
    records.save_study_config(engine, cfg.study.name, cfg.model_dump(mode="json"))
    study = open_study(cfg)
    done = measured_trials(study)
    remaining = cfg.study.n_trials - done
    if remaining <= 0:
        render.note(f"study {cfg.study.name!r} already has {done} trials "
                    f"(n_trials={cfg.study.n_trials}); raise --trials to run more")
        return 0
    if done:
        render.note(f"resuming study {cfg.study.name!r}: {done} trials kept, {remaining} to go")
    enqueue_baseline(study)
    with graceful_interrupt() as gate, render.trial_progress(cfg.study.n_trials, done) as update:
        objective = Objective(
            space=space, context=context, backend=backend,
            workload=workload_from(cfg), target_concurrency=cfg.workload.target_concurrency,
            limits=cfg.workload.limits, study_name=cfg.study.name, engine=engine, gate=gate)
        progress = run_trials(study, objective, remaining, lambda p: update(p.best_tok_s),
                              catch=(TransientFailure,))
    if progress.rejected:
        render.note(f"{progress.rejected} samples broke the search space's constraints and "
                    "were rejected before measuring (recorded as invalid_config)")
    if progress.measured < remaining:
        render.note(f"stopped after {progress.measured} measured trials: the sampler keeps "
                    "proposing samples the space's constraints reject", "yellow")
    return progress.measured
