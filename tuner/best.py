"""``dflash-tune best``: the configuration to run, as a table, a record or a launch command."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from backends.flags import LaunchTarget
from backends.flags import is_experimental
from backends.flags import render_command
from backends.flags import render_env
from backends.flags import render_shell
from backends.launch_params import InvalidParams
from backends.launch_params import LaunchParams
from tuner import records
from tuner.config import Config
from tuner.errors import NoResultError
from tuner.records import TrialRecord
from tuner.selection import Candidate
from tuner.selection import Ranking
from tuner.selection import config_key
from tuner.selection import choose
from tuner.sla import Limit
from tuner.wiring import launch_target_from


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
            return launch and render_command(self.engine, launch, self.target, self.version,
                                             self.overrides)
        except InvalidParams:  # UnsupportedParams
            return None

    def env(self, launch: LaunchParams) -> dict[str, str]:
        return render_env(self.engine, launch, self.version)


@dataclass(slots=True)
class BestResult:
    chosen: Candidate
    front: list[Candidate]
    engine: str
    emitter: Emitter
    argv: list[str]
    env: dict[str, str]
    experimental: bool
    limits: list[Limit]
    target_concurrency: int
    trials: list[TrialRecord]
    ranking: Ranking

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
            "experimental": self.experimental,
        }


def find_best(cfg: Config, engine: str | None, sla: list[str] | None) -> BestResult:
    missing = records.missing_sqlite_file(cfg.study.storage)
    if missing:
        raise NoResultError(f"no results DB at {missing}; run `dflash-tune run` first")
    db = records.connect(cfg.study.storage)
    stored = records.load_study_config(db, cfg.study.name)
    if stored is None:
        known = ", ".join(records.study_names(db)) or "none"
        raise NoResultError(f"no study named {cfg.study.name!r} in {cfg.study.storage} "
                            f"(studies: {known}); run `dflash-tune run` first")
    run_cfg = Config.model_validate(stored)  # flags and SLA follow what the study ran with
    engine = engine or run_cfg.backend.engine
    limits = [Limit.parse(s) for s in sla] if sla is not None else run_cfg.workload.limits
    target = run_cfg.workload.target_concurrency
    same = engine == run_cfg.backend.engine  # the study's pinned version and overrides apply
    emit = Emitter(engine, launch_target_from(run_cfg),
                   run_cfg.backend.engine_version if same else None,
                   run_cfg.backend.flag_overrides if same else {})
    trials = records.load_trials(db, cfg.study.name)
    ranking = ranking_of(run_cfg, trials, records.load_winner(db, cfg.study.name))
    chosen, front = choose(trials, target, limits,
                           usable=lambda t: emit.argv(t.launch) is not None, ranking=ranking)
    lp = chosen.trial.launch
    return BestResult(chosen=chosen, front=front, engine=engine, emitter=emit,
                      argv=emit.argv(lp), env=emit.env(lp),
                      experimental=is_experimental(engine, lp),
                      limits=limits, target_concurrency=target, trials=trials,
                      ranking=ranking)


def ranking_of(cfg: Config, trials: list[TrialRecord], winner: dict | None = None) -> Ranking:
    """How the study's runs become scores: a launch-aware study compares configurations at
    their own SLA limits; measured (noisy) numbers need ``tuning.repeats`` runs and are ranked
    by a lower bound, predicted ones are exact. A launch-aware study's finals crowned ``winner``
    weighing the calibrated model too; it stands while it meets the SLA asked for."""
    t = cfg.tuning
    noisy = any(not row.get("predicted", True) for trial in trials
                for row in trial.measurements.values())
    return Ranking(point="at_sla_limit" if t.strategy == "launch_aware" else "at_target",
                   min_runs=t.repeats if noisy else 1, penalty=t.mad_penalty,
                   prior_rel_sd=t.noise_prior if noisy else 0.0,
                   gated_only=t.strategy == "launch_aware",
                   winner=config_key(winner) if winner else None)


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

