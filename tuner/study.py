"""Open (or resume) the Optuna study a config describes and run trials into it."""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections import Counter
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field

import optuna

from tuner.claim import Claim
from tuner.config import Config
from tuner.config import StudyConfig
from tuner.storage import storage_errors

StaleCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]

# The baseline is always measured: plain decoding, everything else sampled.
BASELINE = {"speculative_algorithm": "none"}
# Trial user attribute: True when a backend measured the trial. Samples the search space's
# constraints reject never reach a backend, so they teach the sampler without using the budget.
MEASURED_KEY = "measured"
# Trial user attribute of a rejected sample: the constraints it broke (or why it did not parse).
VIOLATIONS_KEY = "violations"
# Give up when the sampler keeps proposing constraint-violating samples: this many per trial
# still owed, or this many in a row (a space whose constraints reject everything ends in
# seconds, not after thousands of samples).
MAX_REJECTED_PER_TRIAL = 20
MAX_REJECTED_IN_A_ROW = 100
# Study user attribute: how many runs (workers, resumes) have joined the study.
JOINS_KEY = "sampler_joins"


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


def open_storage(study: StudyConfig, on_stale: StaleCallback | None = None
                 ) -> optuna.storages.RDBStorage:
    """The study's storage. With ``on_stale`` (``run``'s workers) running trials send
    heartbeats, and ``on_stale`` gets each trial whose worker died; readers need neither."""
    heartbeat = {} if on_stale is None or study.heartbeat_s is None else {
        "heartbeat_interval": study.heartbeat_s, "heartbeat_stale_trial_callback": on_stale}
    with warnings.catch_warnings(), storage_errors(study.storage):
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
            study.storage, engine_kwargs=_engine_kwargs(study.storage), **heartbeat)


def open_study(cfg: Config, n_objectives: int = 2,
               storage: optuna.storages.RDBStorage | None = None) -> optuna.Study:
    """Create or load the study; this run's sampler gets a seed of its own (``join_seed``)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with storage_errors(cfg.study.storage):
        study = optuna.create_study(
            study_name=cfg.study.name, storage=storage or open_storage(cfg.study),
            load_if_exists=True, directions=["maximize"] * n_objectives,
            sampler=make_sampler(cfg.study.sampler, cfg.study.seed))
        joins = study.user_attrs.get(JOINS_KEY, 0)
        study.set_user_attr(JOINS_KEY, joins + 1)
    study.sampler = make_sampler(cfg.study.sampler, join_seed(cfg.study.seed, joins))
    return study


def join_seed(seed: int | None, joins: int) -> int | None:
    """The sampler seed of the run that joins a study after ``joins`` others: the study's seed
    for the first, one derived from it for each later worker or resume. The same seed again
    would replay the first run's samples, measuring those configurations a second time."""
    if seed is None or joins == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{joins}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big")


def enqueue_baseline(study: optuna.Study) -> None:
    study.enqueue_trial(BASELINE, skip_if_exists=True)


def measure_enqueued(study: optuna.Study, objective: Callable, params: dict,
                     catch: tuple[type[Exception], ...], **user_attrs: object) -> None:
    """One trial of ``study`` measuring ``params`` (chosen by us, not by the sampler), with
    ``user_attrs`` saying why."""
    study.enqueue_trial(params, user_attrs=user_attrs)
    study.optimize(objective, n_trials=1, catch=catch, gc_after_trial=False)


@dataclass(slots=True)
class Progress:
    """What the progress display needs after each measured trial."""

    measured: int
    rejected: int
    best_tok_s: float | None
    violations: Counter[str] = field(default_factory=Counter)  # reason -> rejected samples
    rejected_in_a_row: int = 0

    def gave_up(self, limit: int) -> bool:
        return self.rejected >= limit or self.rejected_in_a_row >= MAX_REJECTED_IN_A_ROW


def run_trials(study: optuna.Study, objective: Callable, claim: Claim,
               on_trial: Callable[[Progress], None], catch: tuple[type[Exception], ...],
               stop: Callable[[], bool]) -> Progress:
    """Run trials while the study's budget has room (shared with any other worker on it), or
    until too many samples were rejected or ``stop`` says so."""
    progress = Progress(measured=0, rejected=0, best_tok_s=None)
    give_up = MAX_REJECTED_PER_TRIAL * max(1, claim.budget.target - claim.budget.measured())

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if not trial.user_attrs.get(MEASURED_KEY):
            progress.rejected += 1
            progress.rejected_in_a_row += 1
            progress.violations.update(trial.user_attrs.get(VIOLATIONS_KEY, ()))
            return
        progress.measured += 1
        progress.rejected_in_a_row = 0
        if trial.state == optuna.trial.TrialState.COMPLETE and _feasible(trial):
            value = trial.values[0]
            progress.best_tok_s = max(value, progress.best_tok_s or value)
        on_trial(progress)

    while not progress.gave_up(give_up) and claim.wait_turn(stop):
        try:  # one trial per call: the claim lock is taken before each Optuna ask
            with _failures_told_once(catch):
                study.optimize(claim.marking(objective), n_trials=1, callbacks=[callback],
                               catch=catch, gc_after_trial=False)
        finally:
            claim.lock.release()  # already released unless the ask itself failed
    return progress


class _FailedTrialFilter(logging.Filter):
    """Optuna logs a failed trial as a warning with the error's whole traceback, then once
    more with its value. An error it re-raises is reported once, as one line, by the command
    (a bug's traceback under --debug), so both go; a failure it catches (retried) keeps its
    first line, without the traceback."""

    def __init__(self, catch: tuple[type[Exception], ...]) -> None:
        super().__init__()
        self.catch = catch

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not (message.startswith("Trial ") and " failed with " in message):
            return True
        error = record.exc_info[1] if record.exc_info else None
        if error is None or not isinstance(error, self.catch):
            return False
        record.exc_info, record.exc_text = None, None
        return True


@contextmanager
def _failures_told_once(catch: tuple[type[Exception], ...]) -> Iterator[None]:
    logger, quiet = logging.getLogger("optuna.study._optimize"), _FailedTrialFilter(catch)
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _feasible(trial: optuna.trial.FrozenTrial) -> bool:
    return all(v <= 0 for v in trial.constraints.values())


def _engine_kwargs(url: str) -> dict:
    return {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
