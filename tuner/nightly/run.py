"""``dflash-tune nightly``: re-measure the configuration ``best`` picks, the same layout without
speculation and a few neighbours, and say whether it got slower than it used to be.

Exit codes: 0 fine, 1 the incumbent regressed beyond noise, 2 nothing could be measured.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from backends import Backend
from backends.launch_params import LaunchParams
from tuner import records
from tuner.best import BestResult
from tuner.best import find_best
from tuner.best import format_command
from tuner.config import Config
from tuner.errors import NoResultError
from tuner.interrupt import graceful_interrupt
from tuner.nightly import fingerprint
from tuner.nightly.judge import Findings
from tuner.nightly.judge import Settings
from tuner.nightly.judge import findings_of
from tuner.nightly.measure import ProbeResult
from tuner.nightly.measure import measure_all
from tuner.nightly.measure import nightly_workload
from tuner.nightly.plan import Probe
from tuner.nightly.plan import plan
from tuner.nightly.report import lines
from tuner.nightly.report import summary
from tuner.records import nightly
from tuner.wiring import backend_from
from tuner.wiring import workload_from

EXIT_OK, EXIT_REGRESSION, EXIT_UNMEASURABLE = 0, 1, 2
# A run on another host cannot be asked whether it is alive, and a pid can be reused; a nightly
# job still going after a day is dead or hopeless either way.
STALE_AFTER = timedelta(hours=24)


@dataclass(slots=True)
class NightlyOutcome:
    exit_code: int
    lines: list[str]  # for people (stderr)
    status: str  # the run row's status: ok | regression | error
    run_id: int | None = None
    record: dict[str, Any] = field(default_factory=dict)  # for `--format json`

    def as_dict(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, "status": self.status, "run_id": self.run_id,
                "lines": self.lines, **self.record}


def run_nightly(cfg: Config, repeats: int = 5, explore: int = 2, threshold: float = 0.05,
                mad_k: float = 3.0, backend: Backend | str | None = None, *, history: int = 5,
                rebase: bool = False) -> NightlyOutcome:
    """Measure the study's incumbent, its baseline and ``explore`` neighbours; store and judge.

    ``backend``: an instance, a backend name (built for the study's deployment), or None for
    the backend the study ran with. ``history``: earlier runs a reference is the median of.
    ``rebase``: today's numbers start a new reference (after an accepted change) instead of
    being judged. Raises ValueError for bad settings; KeyboardInterrupt passes through after
    the run is marked 'error'.
    """
    settings = Settings(repeats, explore, threshold, mad_k, history, rebase)
    try:
        best = find_best(cfg, None, None)
    except NoResultError as err:
        return _cannot_measure(cfg, f"nothing to re-measure: {err}")
    db = nightly.connect(cfg.study.storage)
    run_cfg = _study_config(db, cfg)
    live, notes = _close_dead_runs(db, cfg.study.name)
    if live:
        return NightlyOutcome(EXIT_UNMEASURABLE, [*notes, _busy(live)], nightly.ERROR)
    backend = _backend(backend, run_cfg)
    return _measure_and_judge(db, cfg.study.name, run_cfg, best, backend, settings, notes)


def _measure_and_judge(db: sa.Engine, study: str, run_cfg: Config, best: BestResult,
                       backend: Backend, settings: Settings, notes: list[str]) -> NightlyOutcome:
    target = best.target_concurrency
    probes = plan(best.chosen.trial.params, _max_block(run_cfg), settings.repeats,
                  settings.explore, nightly.finished_runs(db, study),
                  usable=lambda lp: command_for(best, lp) is not None)
    fp, previous_fp = fingerprint.collect(run_cfg), nightly.last_fingerprint(db, study)
    run_id = nightly.start_run(db, study, probes[0].label, probes[0].params,
                               f"output_tok_s@{target}", fp, os.getpid(), settings.rebase)
    notes.append(f"nightly run {run_id} of study {study!r}: the incumbent is study trial "
                 f"{best.chosen.trial.trial_number}")
    results = _measure_stored(db, run_id, study, backend, probes, run_cfg, settings)
    # A study number is a fair first reference only if the same kind of backend produced it:
    # a prediction of the model backend says nothing about what a real server does tonight.
    trials = [t for t in records.load_trials(db, study) if t.backend == backend.name]
    found = findings_of(results, db, study, trials, run_cfg, settings)
    found.env_changes = fingerprint.changes(previous_fp, fp)
    if found.winner:
        found.winner_command = command_for(best, found.winner[0].probe.launch)
    return _conclude(db, run_id, found, settings, notes)


def _measure_stored(db: sa.Engine, run_id: int, study: str, backend: Backend,
                    probes: list[Probe], run_cfg: Config, settings: Settings) -> list[ProbeResult]:
    """Measure every probe, committing each repeat as it lands."""
    target = run_cfg.workload.target_concurrency

    def save(probe, repeat, rows, failure) -> None:
        nightly.save_repeat(db, run_id, study, probe, repeat, rows, target, failure)

    workload = nightly_workload(workload_from(run_cfg), target)
    try:
        with graceful_interrupt() as gate:
            return measure_all(backend, probes, workload, target, gate, save, settings.min_ok)
    except BaseException as err:  # Ctrl-C or a bug: say so now rather than leave 'running'
        nightly.finish_run(db, run_id, nightly.ERROR, _stopped(err, nightly.kept(db, run_id)))
        raise


def _conclude(db: sa.Engine, run_id: int, found: Findings, settings: Settings,
              notes: list[str]) -> NightlyOutcome:
    incumbent = found.results[0]
    if len(incumbent.values) < settings.min_ok:
        message = (f"could not measure the incumbent: {len(incumbent.failures)} of "
                   f"{incumbent.probe.repeats} repeats failed")
        nightly.finish_run(db, run_id, nightly.ERROR, message)
        return NightlyOutcome(EXIT_UNMEASURABLE, [*notes, *lines(found, message)],
                              nightly.ERROR, run_id)
    status = nightly.REGRESSION if found.regressed and not settings.rebase else nightly.OK
    numbers, message = found.numbers(), summary(found)
    nightly.finish_run(db, run_id, status, message, **numbers)
    code = EXIT_REGRESSION if status == nightly.REGRESSION else EXIT_OK
    return NightlyOutcome(code, [*notes, *lines(found, message)], status, run_id, numbers)


def command_for(best: BestResult, lp: LaunchParams) -> str | None:
    """The launch command for ``lp``, rendered like ``best --emit-flags``; None when the
    study's engine cannot express it."""
    argv = best.emitter.argv(lp)
    return argv and format_command(replace(best, argv=argv, env=best.emitter.env(lp)), "shell")


def _close_dead_runs(db: sa.Engine, study: str) -> tuple[nightly.OpenRun | None, list[str]]:
    """Mark runs that died 'error' (abandoned); return a live one if there is one."""
    live, notes = None, []
    for run in nightly.open_runs(db, study):
        if _alive(run):
            live = run
            continue
        kept = nightly.abandon(db, run)
        notes.append(f"run {run.id} (started {run.created_at:%Y-%m-%d %H:%M} UTC) never "
                     f"finished; marked abandoned, its {kept} measurements kept, not used")
    return live, notes


def _alive(run: nightly.OpenRun) -> bool:
    if nightly.now() - run.created_at >= STALE_AFTER:  # also guards against a reused pid
        return False
    if run.host != socket.gethostname():
        return True  # cannot ask another machine; trust it until STALE_AFTER
    if run.pid == os.getpid():  # this process runs one nightly at a time: that one is over
        return False
    try:
        os.kill(run.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _busy(run: nightly.OpenRun) -> str:
    return (f"another nightly run of this study is in progress (run {run.id}, pid {run.pid} on "
            f"{run.host}, started {run.created_at:%Y-%m-%d %H:%M} UTC); not measuring alongside")


def _stopped(err: BaseException, kept: int) -> str:
    why = "interrupted" if isinstance(err, KeyboardInterrupt) else f"{type(err).__name__}: {err}"
    return (f"stopped before finishing ({why}) after {kept} measurements; they are kept but "
            "not used as history")


def _cannot_measure(cfg: Config, message: str) -> NightlyOutcome:
    """Exit 2; recorded as an 'error' run when the study exists, so the dashboard shows it."""
    if records.missing_sqlite_file(cfg.study.storage):
        return NightlyOutcome(EXIT_UNMEASURABLE, [message], nightly.ERROR)
    db = nightly.connect(cfg.study.storage)
    if records.load_study_config(db, cfg.study.name) is None:
        return NightlyOutcome(EXIT_UNMEASURABLE, [message], nightly.ERROR)
    fp = fingerprint.collect(_study_config(db, cfg))
    run_id = nightly.start_run(db, cfg.study.name, "", {}, "", fp, os.getpid(), False)
    nightly.finish_run(db, run_id, nightly.ERROR, message)
    return NightlyOutcome(EXIT_UNMEASURABLE, [message], nightly.ERROR, run_id)


def _study_config(db: sa.Engine, cfg: Config) -> Config:
    """The config the study ran with: the deployment and workload to re-measure."""
    stored = records.load_study_config(db, cfg.study.name)
    return Config.model_validate(stored) if stored else cfg


def _backend(backend: Backend | str | None, run_cfg: Config) -> Backend:
    if backend is None or isinstance(backend, str):
        raw = run_cfg.model_dump(mode="json")
        raw["backend"]["name"] = backend or raw["backend"]["name"]
        return backend_from(Config.model_validate(raw))
    return backend


def _max_block(run_cfg: Config) -> int:
    return run_cfg.drafter.block_size if run_cfg.drafter else 1
