"""Which worker measured each trial: the ``worker`` mark (``host:pid``) that ``run`` puts on each
trial it claims in Optuna's storage (docs/SCALE_OUT.md)."""

from __future__ import annotations

from collections import defaultdict

import sqlalchemy as sa

from tuner.budget import WORKER_KEY
from tuner.dashboard.optuna_study import load_optuna_study
from tuner.study import MEASURED_KEY


def trial_workers(engine: sa.Engine, storage_url: str, study_name: str) -> dict[str, list[int]]:
    """Worker -> the measured trials it ran, in the order it joined; empty when the DB holds no
    Optuna study of that name."""
    study, _ = load_optuna_study(engine, storage_url, study_name)
    if study is None:
        return {}
    by_worker: dict[str, list[int]] = defaultdict(list)
    for t in study.get_trials(deepcopy=False):
        if WORKER_KEY in t.user_attrs and t.user_attrs.get(MEASURED_KEY):
            by_worker[t.user_attrs[WORKER_KEY]].append(t.number)
    return dict(by_worker)


def workers_line(by_worker: dict[str, list[int]]) -> str:
    """``host:pid: #0 #3; host2:pid: #1 #2`` (the header's "measured by" row)."""
    return "; ".join(f"{w}: {' '.join(f'#{n}' for n in numbers)}"
                     for w, numbers in by_worker.items())
