"""``dflash-tune run`` with ``tuning.strategy: launch_aware``: wire the config to one worker of
the study (resuming what it already holds, alongside any other workers on it), and show the
study's progress per launch."""

from __future__ import annotations

import optuna

from backends.prompts import workload_prompts
from tuner import records
from tuner import render
from tuner.budget import Budget
from tuner.claim import Claim
from tuner.claim_lock import claim_lock
from tuner.config import Config
from tuner.launches.gates import Gates
from tuner.launches.launcher import LAUNCH_OBJECTIVES, Launch
from tuner.launches.launcher import Launcher
from tuner.launches.screen import Screen
from tuner.launches.strategy import PROBE_REFERENCE
from tuner.launches.strategy import LaunchAware
from tuner.launches.strategy import Outcome
from tuner.launches.worker import LaunchWorker
from tuner.objective import name_metrics
from tuner.resume import check_space
from tuner.resume import keep_config
from tuner.storage import storage_errors
from tuner.study import open_storage
from tuner.study import open_study
from tuner.wiring import backend_from
from tuner.wiring import deployment_from
from tuner.wiring import efficiency_from
from tuner.wiring import space_context
from tuner.wiring import space_from
from tuner.wiring import workload_from

PROBE_INPUT_LEN = 64


def build(cfg: Config, backend=None) -> LaunchWorker:
    space = space_from(cfg)
    backend, context = backend or backend_from(cfg), space_context(cfg)
    workload, limits = workload_from(cfg), cfg.workload.limits
    top = max(cfg.workload.concurrency)
    budget = _join_study(cfg)
    launcher = Launcher(budget.study, space, context, backend, workload, limits, budget.engine,
                        cfg.study.name, top, cfg.tuning.long_window_factor)
    check_space(launcher.study, space, cfg)
    screen = Screen(deployment_from(cfg), space, context, workload, limits, top,
                    efficiency_from(cfg), cfg.tuning.screen_samples, cfg.study.seed or 0)
    g = cfg.tuning.gates
    prompts = workload_prompts(cfg.model.path, min(PROBE_INPUT_LEN, workload.input_len),
                               g.probe_prompts, cfg.study.seed or 0)
    gates = Gates(g, prompts, workload.output_len,
                  reference=launcher.study.user_attrs.get(PROBE_REFERENCE))
    lock = claim_lock(cfg.study.storage, f"study:{cfg.study.name}")
    return LaunchWorker(LaunchAware(screen, cfg.tuning), launcher, gates, Claim(budget, lock))


def _join_study(cfg: Config) -> Budget:
    """Open the DB and the study, one worker at a time (tables, config row, metric names)."""
    url = cfg.study.storage
    with storage_errors(url), claim_lock(url, "setup"):
        engine = records.connect(url)
        keep_config(engine, cfg)  # refuses a worker or resume that changes what a launch means
        storage = open_storage(cfg.study, on_stale=_planned_again)
        study = open_study(cfg, storage=storage)
        name_metrics(study, LAUNCH_OBJECTIVES)
    return Budget(target=cfg.tuning.launches, study=study, storage=storage, engine=engine,
                  heartbeats=cfg.study.heartbeat_s is not None)


def _planned_again(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """A dead worker's launch needs no copy: it has no record, so it no longer counts, and the
    next decision, made without it, plans what it was running again."""


def run_launch_aware(cfg: Config) -> Outcome:
    worker = build(cfg)
    done = worker.claim.budget.measured()
    if done:
        render.note(f"resuming study {cfg.study.name!r}: {done} launches kept")
    with render.launch_progress(cfg.tuning.launches) as update:
        def shown(launches: list[Launch], flying: int) -> None:
            values = [x.value for x in launches if x.value is not None]
            update(len(launches), flying, max(values, default=None))

        worker.on_progress = shown
        outcome = worker.run()
    if outcome.winner is not None:
        records.save_winner(worker.launcher.engine, cfg.study.name, outcome.winner.params)
    _report(outcome, worker)
    return outcome


def _report(outcome: Outcome, worker: LaunchWorker) -> None:
    render.note(f"{outcome.launches} launches ({outcome.launch_s / 60:.1f} min launching, "
                f"{outcome.measure_s / 60:.1f} min measuring)")
    if worker.gates.skipped:
        render.note(f"losslessness probe skipped: {worker.gates.skipped}", "yellow")
    if outcome.winner is None:
        render.note("no configuration passed the finals within the launch budget; raise "
                    "tuning.launches", "yellow")
        return
    label = outcome.winner.launch.label()
    render.note(f"winner after {outcome.runs} launches of it, gates passed: {label}")
