"""What a resumed study may change, and the refusal when a change alters what a trial means.

A study's trials compare with each other only under one deployment (hardware, model, drafter,
backend and engine), workload shape and search space. Budgets, the sampler, the SLA and where the
server listens may change between runs of one study (docs/TUNING.md, "Resuming a study").
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.distributions import CategoricalDistribution
from optuna.distributions import FloatDistribution
from optuna.distributions import IntDistribution

from search_spaces import CategoricalParam
from search_spaces import FloatParam
from search_spaces import IntParam
from search_spaces import SearchSpace
from tuner import records
from tuner.config import Config
from tuner.errors import ConfigError
from tuner.storage import storage_errors

# Dotted keys (a section stands for all its keys) that may differ from the stored config.
MAY_CHANGE = ("study", "tuning", "workload.sla", "workload.ttft_p50_ms", "workload.ttft_p99_ms",
              "backend.host", "backend.port", "backend.flag_overrides")
# ... except these, inside a section that may change: launch-aware trials are whole launches.
MUST_KEEP = ("tuning.strategy",)
SHOWN_CHARS = 40  # of a changed value
# What Optuna records for each kind of sampled parameter; it refuses a parameter whose kind, or
# whose categorical choices, differ from what a trial of the study already recorded.
KINDS = {IntParam: IntDistribution, FloatParam: FloatDistribution,
         CategoricalParam: CategoricalDistribution}


def keep_config(engine: sa.Engine, cfg: Config) -> None:
    """Store ``cfg`` as the study's config; refuse (``ConfigError``) if the study exists and
    ``cfg`` changes what its trials mean. Call under the setup lock."""
    with storage_errors(cfg.study.storage):
        stored = records.load_study_config(engine, cfg.study.name)
        current = cfg.model_dump(mode="json")
        changed = [] if stored is None else meaning_changes(stored, current)
        if changed:
            line = (f"study {cfg.study.name!r} was run with other settings, which change what "
                    f"its trials mean: {'; '.join(changed)}; resume it with its own settings, or "
                    "start a new study with --study NEW_NAME (docs/TUNING.md: what may change "
                    "on resume)")
            raise ConfigError([line])
        records.save_study_config(engine, cfg.study.name, current)


def check_space(study: optuna.Study, space: SearchSpace, cfg: Config) -> None:
    """Refuse a search space edited in place since the study began, where Optuna would (at the
    first such sample, with its own "dynamic value space" error)."""
    changed = space_changes(study.get_trials(deepcopy=False), space)
    if changed:
        line = (f"search space {cfg.search_space!r} changed since study {cfg.study.name!r} "
                f"began: {'; '.join(changed)}; undo that, or start a new study with --study "
                "NEW_NAME")
        raise ConfigError([line])


def space_changes(trials: list[optuna.trial.FrozenTrial], space: SearchSpace) -> list[str]:
    """``name: old -> new`` for each parameter whose kind or choices changed."""
    recorded: dict[str, Any] = {}
    for trial in trials:
        recorded.update(trial.distributions)
    changed = []
    for param in space.params:
        old, kind = recorded.get(param.name), KINDS.get(type(param))
        if old is None or kind is None:
            continue
        if not isinstance(old, kind):
            changed.append(f"{param.name}: {type(old).__name__} -> {kind.__name__}")
        elif kind is CategoricalDistribution and tuple(old.choices) != tuple(param.choices):
            changed.append(f"{param.name}: choices {list(old.choices)} -> {list(param.choices)}")
    return changed


def meaning_changes(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for each changed key that is not free to change."""
    return [f"{key}: {_shown(old)} -> {_shown(new)}" for key, old, new in _diff(stored, current)
            if not _may_change(key)]


def _diff(old: Any, new: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        # A key on one side only is a field added or removed between versions: not a change.
        for key in sorted(old.keys() & new.keys()):
            yield from _diff(old[key], new[key], (*path, key))
    elif old != new:
        yield ".".join(path), old, new


def _may_change(key: str) -> bool:
    def under(prefixes: tuple[str, ...]) -> bool:
        return any(key == p or key.startswith(p + ".") for p in prefixes)

    return under(MAY_CHANGE) and not under(MUST_KEEP)


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."
