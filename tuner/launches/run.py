"""``dflash-tune run`` with ``tuning.strategy: launch_aware``: wire the config to the strategy,
resume what the study already measured, and show progress per launch."""

from __future__ import annotations


from backends.prompts import workload_prompts
from tuner import records
from tuner import render
from tuner.config import Config
from tuner.launches.gates import Gates
from tuner.launches.launcher import LAUNCH_OBJECTIVES, Launch
from tuner.launches.launcher import Launcher
from tuner.launches.screen import Screen
from tuner.launches.strategy import PROBE_REFERENCE
from tuner.launches.strategy import LaunchAware
from tuner.launches.strategy import Outcome
from tuner.resume import check_space
from tuner.resume import keep_config
from tuner.objective import name_metrics
from tuner.study import open_study
from tuner.wiring import backend_from
from tuner.wiring import deployment_from
from tuner.wiring import efficiency_from
from tuner.wiring import space_context
from tuner.wiring import space_from
from tuner.wiring import workload_from

PROBE_INPUT_LEN = 64


def build(cfg: Config, backend=None) -> LaunchAware:
    space = space_from(cfg)
    backend, context = backend or backend_from(cfg), space_context(cfg)
    workload, limits = workload_from(cfg), cfg.workload.limits
    top = max(cfg.workload.concurrency)
    engine = records.connect(cfg.study.storage)
    keep_config(engine, cfg)  # refuses a resume that changes what a launch means
    launcher = Launcher(open_study(cfg), space, context, backend, workload, limits, engine,
                        cfg.study.name, top, cfg.tuning.long_window_factor)
    check_space(launcher.study, space, cfg)
    name_metrics(launcher.study, LAUNCH_OBJECTIVES)
    launcher.launches = [Launch.from_record(t, limits)  # resuming: what earlier runs measured
                         for t in records.load_trials(engine, cfg.study.name) if t.measured]
    screen = Screen(deployment_from(cfg), space, context, workload, limits, top,
                    efficiency_from(cfg), cfg.tuning.screen_samples, cfg.study.seed or 0)
    g = cfg.tuning.gates
    prompts = workload_prompts(cfg.model.path, min(PROBE_INPUT_LEN, workload.input_len),
                               g.probe_prompts, cfg.study.seed or 0)
    gates = Gates(g, prompts, workload.output_len,
                  reference=launcher.study.user_attrs.get(PROBE_REFERENCE))
    return LaunchAware(launcher, screen, gates, cfg.tuning)


def run_launch_aware(cfg: Config) -> Outcome:
    strategy = build(cfg)
    done = len(strategy.launcher.launches)
    if done:
        render.note(f"resuming study {cfg.study.name!r}: {done} launches kept")
    with render.trial_progress(cfg.tuning.launches, done, "launches") as update:
        best: list[float] = []

        def shown(launch: Launch) -> None:
            if launch.value is not None:
                best.append(launch.value)
            update(max(best) if best else None)

        strategy.on_launch = shown
        outcome = strategy.run()
    if outcome.winner is not None:
        records.save_winner(strategy.launcher.engine, cfg.study.name, outcome.winner.params)
    _report(outcome, strategy)
    return outcome


def _report(outcome: Outcome, strategy: LaunchAware) -> None:
    render.note(f"{outcome.launches} launches ({outcome.launch_s / 60:.1f} min launching, "
                f"{outcome.measure_s / 60:.1f} min measuring)")
    if strategy.gates.skipped:
        render.note(f"losslessness probe skipped: {strategy.gates.skipped}", "yellow")
    if outcome.winner is None:
        render.note("no configuration passed the finals within the launch budget; raise "
                    "tuning.launches", "yellow")
        return
    label = outcome.winner.launch.label()
    render.note(f"winner after {outcome.runs} launches of it, gates passed: {label}")
