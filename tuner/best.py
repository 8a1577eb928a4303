"""``dflash-tune best``: the configuration to run, as a table, a record or a launch command."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from typing import Any

from backends.flags import LaunchTarget
from backends.flags import default_port
from backends.flags import engine_label
from backends.flags import experimental_note
from backends.flags import render_command
from backends.flags import render_env
from backends.flags import render_shell
from backends.launch_params import InvalidParams
from backends.launch_params import LaunchParams
from pydantic import ValidationError

from tuner import records
from tuner import stats
from tuner.config import Config
from tuner.crossover import Crossover
from tuner.crossover import study_crossover
from tuner.errors import NoResultError
from tuner.errors import StorageError
from tuner.records import TrialRecord
from tuner.schedule import budget_schedule
from tuner.schedule import layout_of
from tuner.selection import Candidate
from tuner.selection import Ranking
from tuner.selection import choose
from tuner.selection import config_key
from tuner.sla import Limit
from tuner.sla import extreme
from tuner.sla import meets
from tuner.sla import queueing
from tuner.sla import with_bounds
from tuner.storage import shown_url
from tuner.wiring import launch_target_from
from tuner.wiring import measured_kernels

DEFAULT_TOP = 10  # front members shown and returned


@dataclass(slots=True, frozen=True)
class Emitter:
    """How a configuration becomes an engine's launch command (what ``--emit-flags`` prints)."""

    engine: str
    target: LaunchTarget
    version: str | None
    overrides: dict[str, str | None]

    def argv(self, launch: LaunchParams | None) -> list[str] | None:
        """None where the engine cannot express ``launch`` (or it did not parse)."""
        try:
            return self._render(launch) if launch is not None else None
        except InvalidParams:  # UnsupportedParams
            return None

    def why_not(self, launch: LaunchParams | None) -> str | None:
        """Why the engine cannot launch ``launch``; None when it can."""
        if launch is None:
            return "the parameters do not parse"
        try:
            self._render(launch)
        except InvalidParams as err:  # UnsupportedParams
            return str(err)
        return None

    def env(self, launch: LaunchParams) -> dict[str, str]:
        return render_env(self.engine, launch, self.version, self.target)

    def label(self, launch: LaunchParams | None) -> str:
        return engine_label(self.engine, launch) if launch else "not launchable"

    def _render(self, launch: LaunchParams) -> list[str]:
        return render_command(self.engine, launch, self.target, self.version, self.overrides)


@dataclass(slots=True, frozen=True)
class Plain:
    trial: int
    tok_s: float  # median output tok/s of its runs


@dataclass(slots=True)
class BestResult:
    chosen: Candidate
    front: list[Candidate]
    engine: str
    emitter: Emitter
    argv: list[str]
    env: dict[str, str]
    experimental: str | None  # the note for a command no release of the engine runs
    limits: list[Limit]
    target_concurrency: int
    trials: list[TrialRecord]
    ranking: Ranking
    plain: dict[tuple[str, int], Plain]  # (layout, concurrency) -> the plain reference
    warnings: list[str]
    hardware: str = ""  # "8x rtx-pro-6000-server", as the study ran
    top: int = DEFAULT_TOP
    # The chosen launch's knobs away from their defaults that the model cannot price, and those
    # at values no real engine ran in the study (only predicted; empty in a model-only study).
    measured_only: dict[str, Any] = field(default_factory=dict)
    predicted_only: dict[str, Any] = field(default_factory=dict)
    # The best speculative over the best plain configuration at each level, and where
    # speculation stops paying (what the dashboard's concurrency view draws).
    crossover: Crossover | None = None

    def evidence(self) -> list[str]:
        """One line each for the chosen launch's measured-only and predicted-only knobs."""
        lines = []
        if self.measured_only:
            lines.append(f"measured only: {_knobs(self.measured_only)} (the performance model "
                         "prices them at their defaults)")
        if self.predicted_only:
            lines.append(f"predicted only: {_knobs(self.predicted_only)} (no real engine ran "
                         "these values in this study)")
        return lines

    def view(self, c: Candidate) -> dict[str, Any]:
        """One candidate's metrics at the level its throughput was read at."""
        m, lp, base = c.metrics, c.trial.launch, self.plain_for(c)
        return {
            "trial": c.trial.trial_number, "params": c.params,
            "configuration": self.emitter.label(lp), "read_at_concurrency": c.concurrency,
            "runs": c.runs, "output_tok_s": c.throughput, "score_tok_s": c.score,
            "output_tok_s_per_gpu": m.get("output_tok_s_per_gpu"),
            "ttft_p50_ms": m.get("ttft_p50_ms"), "ttft_p99_ms": m.get("ttft_p99_ms"),
            "tpot_p50_ms": m.get("tpot_p50_ms"), "tpot_p99_ms": m.get("tpot_p99_ms"),
            "tok_s_per_user": m.get("tok_s_per_user"), "tok_s_per_user_at_1": c.per_user,
            "speedup_vs_plain": c.throughput / base.tok_s if base and base.tok_s else None,
            "plain_trial": base.trial if base else None,
            "queueing": lp is not None and queueing(lp.max_running_requests, c.concurrency),
        }

    def plain_for(self, c: Candidate) -> Plain | None:
        lp = c.trial.launch
        return lp and self.plain.get((_layout_key(lp), c.concurrency))

    def schedule(self) -> dict[str, Any]:
        """The speculation setting per concurrency band for the chosen configuration's launch,
        ranked as this result was (:mod:`tuner.schedule`)."""
        return budget_schedule(self.trials, self.chosen, self.limits, self.ranking,
                               unusable=lambda t: self.emitter.why_not(t.launch))

    def as_dict(self) -> dict[str, Any]:
        t = self.chosen.trial
        return {
            "trial": t.trial_number, "engine": self.engine, "params": t.params,
            # Read at the target concurrency, or (launch-aware) at the config's SLA limit.
            "output_tok_s_at_target": self.chosen.throughput, "read_at": self.ranking.point,
            "runs": self.chosen.runs,
            "score_tok_s": self.chosen.score,
            "tok_s_per_user_at_1": self.chosen.per_user,
            "target_concurrency": self.target_concurrency,
            "sla": [str(limit) for limit in self.limits], "argv": self.argv, "env": self.env,
            "experimental": self.experimental is not None,
            "metrics": self.view(self.chosen),
            "front": [self.view(c) for c in self.front[:self.top]],
            "warnings": self.warnings,
            "measured_only": self.measured_only, "predicted_only": self.predicted_only,
            "speculation_vs_plain": self.crossover.as_dict() if self.crossover else None,
        }


def find_best(cfg: Config, engine: str | None, sla: list[str] | None,
              top: int = DEFAULT_TOP) -> BestResult:
    """The study of ``cfg`` (its storage and name) ranked under ``sla`` (default: the
    study's), for ``engine`` (default: the study's)."""
    db, stored = open_records(cfg.study.storage, cfg.study.name)
    run_cfg = study_config(stored, cfg.study.storage, cfg.study.name)
    engine = engine or run_cfg.backend.engine
    w = run_cfg.workload  # flags and SLA follow what the study ran with
    limits = with_bounds([Limit.parse(s) for s in sla], w.bounds) if sla is not None else w.limits
    emit = emitter_for(run_cfg, engine)
    trials = records.load_trials(db, cfg.study.name)
    ranking = ranking_of(run_cfg, trials, records.load_winner(db, cfg.study.name))
    target = w.target_concurrency
    chosen, front = choose(trials, target, limits, unusable=lambda t: emit.why_not(t.launch),
                           ranking=ranking)
    lp = chosen.trial.launch
    return BestResult(chosen=chosen, front=front, engine=engine, emitter=emit,
                      argv=emit.argv(lp), env=emit.env(lp),
                      experimental=experimental_note(engine, lp),
                      limits=limits, target_concurrency=target,
                      trials=trials, ranking=ranking,
                      plain=_plain_by_layout(trials, limits),
                      warnings=_warnings(chosen, limits, w.output_len),
                      hardware=f"{run_cfg.hardware.gpus}x {run_cfg.hardware.gpu}", top=top,
                      measured_only=_measured_only(lp, measured_kernels(run_cfg)),
                      predicted_only=_predicted_only(lp, trials),
                      crossover=study_crossover(trials, run_cfg))


def _measured_only(launch: LaunchParams | None, measured_kernels: bool) -> dict[str, Any]:
    """``launch``'s non-default knobs the performance model prices at their defaults."""
    from backends.perf_model.backend import unpriced_knobs

    unpriced = unpriced_knobs(measured_kernels)
    chosen = launch.non_default() if launch else {}
    return {k: v for k, v in chosen.items() if k in unpriced}


def _predicted_only(launch: LaunchParams | None, trials: list[TrialRecord]) -> dict[str, Any]:
    """``launch``'s non-default knobs at values no trial measured on a real engine ran with;
    empty when no trial was measured at all (a study of the model)."""
    ran = [t.launch for t in trials if t.ok and t.launch is not None and t.engine_measured]
    if launch is None or not ran:
        return {}
    seen = {item for lp in ran for item in lp.non_default().items()}
    return {k: v for k, v in launch.non_default().items() if (k, v) not in seen}


def _knobs(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items()))


def open_records(storage: str, name: str) -> tuple[Any, dict[str, Any]]:
    """The results DB and the stored config of study ``name``; NoResultError (saying what to
    run) when either is missing. Writes nothing."""
    db = records.open_results(storage)
    stored = records.load_study_config(db, name)
    if stored is None:
        known = ", ".join(records.study_names(db)) or "none"
        raise NoResultError(f"no study named {name!r} in {storage} "
                            f"(studies: {known}); run `dflash-tune run` first")
    return db, stored


def study_config(stored: dict[str, Any], storage: str, name: str) -> Config:
    """The configuration study ``name`` ran with (stored beside its trials), read from
    ``storage``; a stored config this version cannot read is a one-line StorageError naming
    the table and the study."""
    try:
        return Config.model_validate(stored)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(map(str, first["loc"])) or "(top level)"
        raise StorageError(
            f"storage {shown_url(storage)}: table dflash_tune_studies, study {name!r}: its "
            f"stored configuration does not validate ({where}: {first['msg']}); it was written "
            "by another program or version: run the study again into a new DB") from None


def emitter_for(run_cfg: Config, engine: str) -> Emitter:
    """The study's launcher, pinned version, overrides and port apply to its own engine;
    another engine gets its defaults (its own port and start command, not the study engine's)."""
    same = engine == run_cfg.backend.engine
    target = launch_target_from(run_cfg)
    other = replace(target, port=default_port(engine), launcher=())
    return Emitter(engine, target if same else other,
                   run_cfg.backend.engine_version if same else None,
                   run_cfg.backend.flag_overrides if same else {})


def ranking_of(cfg: Config, trials: list[TrialRecord], winner: dict | None = None) -> Ranking:
    """How the study's runs become scores: a launch-aware study compares configurations at
    their own SLA limits; measured (noisy) numbers need ``tuning.repeats`` runs and are ranked
    by a lower bound, predicted ones are exact. A launch-aware study's finals crowned ``winner``
    weighing the calibrated model too; it stands while it meets the SLA asked for."""
    t = cfg.tuning
    noisy = any(trial.engine_measured for trial in trials)
    return Ranking(point="at_sla_limit" if t.strategy == "launch_aware" else "at_target",
                   min_runs=t.repeats if noisy else 1, penalty=t.mad_penalty,
                   prior_rel_sd=t.noise_prior if noisy else 0.0,
                   gated_only=t.strategy == "launch_aware",
                   winner=config_key(winner) if winner else None)


def _plain_by_layout(trials: list[TrialRecord], limits: list[Limit]
                     ) -> dict[tuple[str, int], Plain]:
    """The plain-decoding reference of each layout at each level: its fastest configuration
    there (median over its runs) that serves the load without queueing (running cap, TTFT
    limits) but need not meet the rest of the SLA: plain decoding missing a TPOT limit is often
    why one speculates."""
    admits = [limit for limit in limits if limit.metric.startswith("ttft")]
    runs: dict[tuple[str, int, str], list[tuple[int, float]]] = defaultdict(list)
    for t in trials:
        if not t.ok or t.launch is None or t.launch.speculative:
            continue
        for level, row in t.measurements.items():
            if meets(row, admits) and not queueing(t.launch.max_running_requests, level):
                key = (_layout_key(t.launch), level, config_key(t.params))
                runs[key].append((t.trial_number, row["output_tok_s"]))
    best: dict[tuple[str, int], Plain] = {}
    for (layout, level, _), found in runs.items():
        plain = Plain(found[0][0], stats.median([rate for _, rate in found]))
        if (layout, level) not in best or plain.tok_s > best[layout, level].tok_s:
            best[layout, level] = plain
    return best


def _layout_key(launch: LaunchParams) -> str:
    return config_key(layout_of(launch))


def _warnings(chosen: Candidate, limits: list[Limit], output_len: int) -> list[str]:
    found = extreme(chosen.metrics, limits, output_len)
    lp = chosen.trial.launch
    if lp is not None and queueing(lp.max_running_requests, chosen.concurrency):
        found.append(f"the chosen configuration runs at most {lp.max_running_requests} requests "
                     f"at once but is judged at concurrency {chosen.concurrency}: the rest queue")
    return found


def format_command(result: BestResult, fmt: str) -> str:
    """The launch command alone: shell (env prefix when needed), or argv + env as JSON/YAML."""
    if fmt == "shell":
        prefix = ["env", *(f"{k}={v}" for k, v in sorted(result.env.items()))] if result.env else []
        return render_shell(prefix + result.argv)
    return _dump({"argv": result.argv, "env": result.env}, fmt)


def format_record(result: BestResult, fmt: str) -> str:
    if fmt == "shell":
        return format_command(result, fmt)
    return _dump(result.as_dict(), fmt)


def _dump(data: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, sort_keys=True)
    import yaml

    return yaml.safe_dump(data, sort_keys=True)
