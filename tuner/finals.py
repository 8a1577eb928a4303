"""Finalists of a ``tpe`` study re-measured in fresh launches, so that ``best`` can trust them.

On a measuring backend one run of a configuration is one noisy sample; ``best`` chooses only
configurations with ``tuning.repeats`` runs. After the sampled trials, the best ``finalists``
(by the same lower bound ``best`` ranks by) are relaunched by successive halving up to
``repeats`` runs (``owed_runs``), re-ranking after every launch, so a configuration that was lucky once
drops out as soon as its second run shows it. The performance model is exact: nothing to do.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import optuna

from tuner import records
from tuner.config import Config
from tuner.selection import Ranking
from tuner.selection import candidates
from tuner.study import measure_enqueued


def owed_runs(rank: int, finalists: int, repeats: int) -> int:
    """Successive halving: every finalist gets 2 runs, the better half 3, the better half of
    that 4, ... up to ``repeats``."""
    runs = 1
    for stage in range(2, repeats + 1):
        if rank < max(1, math.ceil(finalists / 2 ** (stage - 2))):
            runs = stage
    return runs


def confirm_finalists(cfg: Config, study: optuna.Study, objective: Callable,
                      catch: tuple[type[Exception], ...], stop: Callable[[], bool],
                      on_launch: Callable[[], None] = lambda: None) -> int:
    """Relaunch finalists until each has the runs it owes; returns how many launches ran. With
    several workers each may do this: a configuration can end up with a run or two extra."""
    t, engine = cfg.tuning, records.connect(cfg.study.storage)
    ranking = Ranking(min_runs=1, penalty=t.mad_penalty, prior_rel_sd=t.noise_prior)
    launched = 0
    for _ in range(t.finalists * t.repeats):  # bounded even if every relaunch fails
        if stop():
            break
        trials = records.load_trials(engine, cfg.study.name)
        ranked = sorted(candidates(trials, cfg.workload.target_concurrency,
                                   cfg.workload.limits, ranking), key=lambda c: -c.score)
        owing = [c for rank, c in enumerate(ranked[:t.finalists])
                 if c.runs < owed_runs(rank, t.finalists, t.repeats)]
        if not owing:
            break
        measure_enqueued(study, objective, owing[0].params, catch)
        launched += 1
        on_launch()
    return launched
