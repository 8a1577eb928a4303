"""``dflash-tune run``: one Optuna study over the search space, recorded in the results DB."""

from __future__ import annotations

from tuner import records
from tuner import render
from tuner.budget import Budget
from tuner.budget import RetryUnrecorded
from tuner.claim import Claim
from tuner.claim_lock import claim_lock
from tuner.config import Config
from tuner.errors import InfeasibleSpaceError
from tuner.finals import confirm_finalists
from tuner.interrupt import graceful_interrupt
from tuner.level_search import LevelSearch
from tuner.level_search import search_levels
from tuner.level_search import walk_starts
from tuner.objective import Objective
from tuner.objective import TransientFailure
from tuner.resume import check_space
from tuner.resume import keep_config
from tuner.selection import config_key
from tuner.storage import storage_errors
from tuner.study import Progress
from tuner.study import enqueue_baseline
from tuner.study import open_storage
from tuner.study import open_study
from tuner.study import run_trials
from tuner.wiring import backend_from
from tuner.wiring import space_context
from tuner.wiring import space_from
from tuner.wiring import workload_from


def run_study(cfg: Config) -> int:
    """Run until the study holds ``n_trials`` measured trials; returns how many ran here.

    Any number of workers, on any number of machines, may run this on one study in a shared
    database (docs/SCALE_OUT.md); together they stop at exactly ``n_trials``."""
    # Everything that can be wrong with the config fails here, before the DB is touched.
    space = space_from(cfg)
    backend, context = backend_from(cfg), space_context(cfg)
    claim = _join_study(cfg)
    done, n_trials = claim.budget.measured(), cfg.study.n_trials
    study = claim.budget.study
    check_space(study, space, cfg)
    objective = Objective(
        space=space, context=context, backend=backend,
        workload=workload_from(cfg), target_concurrency=cfg.workload.target_concurrency,
        limits=cfg.workload.limits, study_name=cfg.study.name, engine=claim.budget.engine,
        gate=None)
    confirm = not backend.predicts and cfg.tuning.repeats > 1
    levels = LevelSearch(space, context, backend, objective.workload) if (
        backend.predicts and cfg.tuning.level_search) else None
    if done >= n_trials:
        render.note(f"study {cfg.study.name!r} already has {done} trials "
                    f"(n_trials={n_trials}); raise --trials to run more")
        # An interrupted run may have left finalists owing re-measurements, or levels unsearched.
        _after_sampling(cfg, study, objective, confirm, levels)
        return 0
    if done:
        render.note(f"resuming study {cfg.study.name!r}: {done} trials kept, "
                    f"{n_trials - done} to go")
    # A DB that fills up or turns read-only mid-run is one line, as at the start.
    with storage_errors(cfg.study.storage), graceful_interrupt() as gate, \
            render.trial_progress(n_trials, done) as update:
        objective.gate = gate
        progress = run_trials(study, objective, claim, lambda p: update(p.best_tok_s),
                              catch=(TransientFailure,), stop=lambda: gate.requested)
    if progress.rejected:
        render.note(f"{progress.rejected} samples broke the search space's constraints and "
                    "were rejected before measuring (recorded as invalid_config)")
    if claim.budget.measured() < n_trials:  # not interrupted: that raised on the way out
        raise InfeasibleSpaceError(_stopped_by_constraints(cfg, progress))
    _after_sampling(cfg, study, objective, confirm, levels)
    return progress.measured


def _stopped_by_constraints(cfg: Config, progress: Progress) -> str:
    top = progress.violations.most_common(1)
    worst = f", most often `{top[0][0]}` ({top[0][1]} samples)" if top else ""
    return (f"stopped after {progress.measured} measured trials: the sampler keeps proposing "
            f"samples that break the constraints of search space {cfg.search_space!r} "
            f"({progress.rejected} rejected{worst}); loosen that constraint or fix the space")


def _after_sampling(cfg: Config, study, objective: Objective, confirm: bool,
                    levels: LevelSearch | None) -> None:
    if confirm:
        _confirm(cfg, study, objective)
    if levels is not None:
        _search_levels(cfg, study, objective, levels)


def _confirm(cfg: Config, study, objective: Objective) -> None:
    with graceful_interrupt() as gate, render.trial_progress(
            cfg.tuning.finalists * cfg.tuning.repeats, 0, "finals") as update:
        objective.gate = gate
        ran = confirm_finalists(cfg, study, objective, (TransientFailure,),
                                lambda: gate.requested, lambda: update(None))
    render.note(f"{ran} finalist re-measurements in fresh launches")


def _search_levels(cfg: Config, study, objective: Objective, search: LevelSearch) -> None:
    trials = records.load_trials(objective.engine, cfg.study.name)
    starts, held = walk_starts(trials), {config_key(t.params) for t in trials}
    with graceful_interrupt() as gate, render.trial_progress(len(starts), 0, "levels") as update:
        objective.gate = gate
        added = search_levels(search, study, objective, starts, held, (TransientFailure,),
                              lambda: gate.requested, lambda: update(None))
    render.note(f"{added} configurations added by searching each family's best at each "
                "concurrency level")


def _join_study(cfg: Config) -> Claim:
    """Open the DB and the study, one worker at a time: concurrent table creation, config
    writes and baseline enqueues would collide (or measure the baseline twice)."""
    url, name = cfg.study.storage, cfg.study.name
    with storage_errors(url), claim_lock(url, "setup"):
        engine = records.connect(url)
        keep_config(engine, cfg)  # refuses a resume that changes what a trial means
        storage = open_storage(cfg.study, RetryUnrecorded(engine, name, cfg.study.max_retries))
        study = open_study(cfg, storage=storage)
        enqueue_baseline(study)
    budget = Budget(target=cfg.study.n_trials, study=study, storage=storage, engine=engine,
                    heartbeats=cfg.study.heartbeat_s is not None)
    return Claim(budget=budget, lock=claim_lock(url, f"study:{name}"))
