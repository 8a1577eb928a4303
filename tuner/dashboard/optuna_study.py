"""The Optuna side of a study, read without changing the DB."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa


def load_optuna_study(engine: sa.Engine, storage_url: str, study_name: str
                      ) -> tuple[Any | None, str]:
    """The study, or None and why it cannot be read."""
    # Optuna creates its tables in a DB that lacks them; a report must not change the DB.
    if not sa.inspect(engine).has_table("studies"):
        return None, "this DB holds no Optuna study"
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=study_name, storage=storage_url), ""
    except KeyError:
        return None, f"no Optuna study named {study_name!r} in this DB"
