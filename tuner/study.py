"""Open (or resume) the Optuna study a config describes and run trials into it."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import optuna

from tuner.config import Config

# The baseline is always measured: plain decoding, everything else sampled.
BASELINE = {"speculative_algorithm": "none"}
# Trial user attribute: True when a backend measured the trial. Samples the search space's
# constraints reject never reach a backend, so they teach the sampler without using the budget.
MEASURED_KEY = "measured"
# Give up when the sampler keeps proposing constraint-violating samples.
MAX_REJECTED_PER_TRIAL = 20


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    """Samplers are named explicitly: Optuna 5 changed TPE's defaults, so pin them here."""
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # Grouped multivariate TPE samples a conditional space jointly, once per trial, which
        # also spares a storage read per parameter.
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                          constant_liar=False)


def open_study(cfg: Config, n_objectives: int = 2) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(
        cfg.study.storage, engine_kwargs=_engine_kwargs(cfg.study.storage))
    return optuna.create_study(
        study_name=cfg.study.name, storage=storage, load_if_exists=True,
        directions=["maximize"] * n_objectives,
        sampler=make_sampler(cfg.study.sampler, cfg.study.seed))


def measured_trials(study: optuna.Study) -> int:
    """Trials a backend measured (the budget ``n_trials`` counts these)."""
    return sum(1 for t in study.get_trials(deepcopy=False) if t.user_attrs.get(MEASURED_KEY))


def enqueue_baseline(study: optuna.Study) -> None:
    study.enqueue_trial(BASELINE, skip_if_exists=True)


@dataclass(slots=True)
class Progress:
    """What the progress display needs after each measured trial."""

    measured: int
    rejected: int
    best_tok_s: float | None


def run_trials(study: optuna.Study, objective: Callable, n_measured: int,
               on_trial: Callable[[Progress], None],
               catch: tuple[type[Exception], ...]) -> Progress:
    """Run until ``n_measured`` more trials were measured (or too many samples were rejected)."""
    progress = Progress(measured=0, rejected=0, best_tok_s=None)

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if not trial.user_attrs.get(MEASURED_KEY):
            progress.rejected += 1
        else:
            progress.measured += 1
            if trial.state == optuna.trial.TrialState.COMPLETE and _feasible(trial):
                value = trial.values[0]
                progress.best_tok_s = max(value, progress.best_tok_s or value)
            on_trial(progress)
        if (progress.measured >= n_measured
                or progress.rejected >= MAX_REJECTED_PER_TRIAL * n_measured):
            study.stop()

    study.optimize(objective, n_trials=None, callbacks=[callback], catch=catch,
                   gc_after_trial=False)
    return progress


def _feasible(trial: optuna.trial.FrozenTrial) -> bool:
    return all(v <= 0 for v in trial.constraints.values())


def _engine_kwargs(url: str) -> dict:
    return {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
