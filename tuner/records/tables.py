"""Every table of ours, beside Optuna's in the same database, on one ``MetaData``.

Users keep results DBs for years: a table or column here is renamed or retyped only with a
migration. ``connect`` (for commands that write: ``run``, ``nightly``) creates whatever is
missing; ``open_results`` (for commands that only read) creates nothing and refuses a DB that
holds none of our tables, and a table added since a DB was written reads as empty.
"""

from __future__ import annotations

from datetime import datetime
from datetime import timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from tuner.errors import NoResultError
from tuner.errors import StorageError
from tuner.storage import shown_url
from tuner.storage import storage_errors

metadata = sa.MetaData()

studies = sa.Table(
    "dflash_tune_studies", metadata,
    sa.Column("name", sa.String(512), primary_key=True),
    sa.Column("config_json", sa.Text, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
)

trials = sa.Table(
    "dflash_tune_trials", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("study", sa.String(512), nullable=False, index=True),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("backend", sa.String(64), nullable=False),
    sa.Column("params_json", sa.Text, nullable=False),
    sa.Column("status", sa.String(32), nullable=False),  # "ok" or a FailureClass value
    # False for samples the search space rejected before any backend saw them.
    sa.Column("measured", sa.Boolean, nullable=False),
    sa.Column("command", sa.Text, nullable=False),  # shell-quoted launch command, "" if none
    sa.Column("env_json", sa.Text, nullable=False),
    sa.Column("log_excerpt", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.UniqueConstraint("study", "trial_number"),
)

# Measurement fields stored as float columns of their own (the rest go in JSON columns).
METRICS = ("output_tok_s", "output_tok_s_per_gpu", "tok_s_per_user", "ttft_p50_ms",
           "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms",
           "accept_len_mean", "peak_mem_gib")

measurements = sa.Table(
    "dflash_tune_measurements", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("study", sa.String(512), nullable=False, index=True),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("concurrency", sa.Integer, nullable=False),
    *(sa.Column(name, sa.Float) for name in METRICS),
    sa.Column("accept_len_hist_json", sa.Text),
    sa.Column("breakdown_json", sa.Text, nullable=False),
    sa.Column("predicted", sa.Boolean, nullable=False),
    sa.Column("failure", sa.String(32)),
)

# The configuration a launch-aware study's finals crowned (the latest row counts): `best` names it
# rather than re-ranking the gated finalists by their runs alone.
winners = sa.Table(
    "dflash_tune_winners", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("study", sa.String(512), nullable=False, index=True),
    sa.Column("params_json", sa.Text, nullable=False),
    sa.Column("decided_at", sa.DateTime, nullable=False),
)

# One row per nightly run; the dashboard's nightly view reads it.
nightly_runs = sa.Table(
    "dflash_tune_nightly", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("study", sa.String(512), nullable=False, index=True),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("finished_at", sa.DateTime),
    sa.Column("status", sa.String(16), nullable=False),  # running | ok | regression | error
    sa.Column("config_label", sa.Text, nullable=False),  # the incumbent, for people
    sa.Column("params_json", sa.Text, nullable=False),
    sa.Column("metric", sa.String(64), nullable=False),  # e.g. output_tok_s@128
    # The incumbent today (median and unscaled MAD of its repeats) and what it was judged by.
    sa.Column("median", sa.Float),
    sa.Column("mad", sa.Float),
    sa.Column("n_repeats", sa.Integer),
    sa.Column("baseline_median", sa.Float),
    sa.Column("reference_median", sa.Float),
    sa.Column("tolerance", sa.Float),  # relative change that counted as noise
    sa.Column("fingerprint_json", sa.Text, nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    # Where the run lives, so the next one can tell a live run from a dead one.
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    # True: this run's numbers start a new reference (``--rebase`` after an accepted change).
    sa.Column("rebased", sa.Boolean, nullable=False, default=False),
)

# One row per repeat of each configuration a nightly run measured.
nightly_repeats = sa.Table(
    "dflash_tune_nightly_measurements", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("dflash_tune_nightly.id"), nullable=False,
              index=True),
    sa.Column("study", sa.String(512), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),  # incumbent | baseline | neighbour
    sa.Column("config_key", sa.String(32), nullable=False, index=True),
    sa.Column("config_label", sa.Text, nullable=False),
    sa.Column("params_json", sa.Text, nullable=False),
    sa.Column("repeat", sa.Integer, nullable=False),
    sa.Column("output_tok_s", sa.Float),  # at the target concurrency
    sa.Column("tok_s_per_user", sa.Float),  # at concurrency 1
    sa.Column("failure", sa.String(32)),
    sa.Column("metrics_json", sa.Text, nullable=False),  # concurrency -> Measurement fields
    sa.Column("created_at", sa.DateTime, nullable=False),
)


def missing_sqlite_file(url: str) -> str | None:
    """The path of a SQLite DB file that does not exist yet (reading it would create it)."""
    parsed = sa.engine.make_url(url)
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return None
    return None if Path(path).exists() else path


def connect(url: str) -> sa.Engine:
    """Engine for ``url`` with every table created; SQLite waits on locks instead of failing.
    A DB that cannot be opened or written raises a one-line ``StorageError``."""
    with storage_errors(url):
        engine = sa.create_engine(url, **_connect_args(url))
        metadata.create_all(engine)
    return engine


def open_results(url: str) -> sa.Engine:
    """Engine for reading the results DB at ``url``; it writes nothing, not even a table.
    NoResultError when there is no DB file yet, StorageError when the DB holds no study of
    ours (another program's file)."""
    missing = missing_sqlite_file(url)
    if missing:
        raise NoResultError(f"no results DB at {missing}; run `dflash-tune run` first")
    with storage_errors(url):
        engine = sa.create_engine(url, **_connect_args(url))
        found = set(sa.inspect(engine).get_table_names())
    core = {studies.name, trials.name, measurements.name}
    if not core <= found:
        engine.dispose()
        raise StorageError(f"storage {shown_url(url)} is not a dflash-tune results DB (it has "
                           f"no {', '.join(sorted(core - found))} table); point --storage at "
                           "the DB `dflash-tune run` wrote")
    return engine


def has_table(engine: sa.Engine, table: sa.Table) -> bool:
    """Whether ``table`` exists: one added after the DB was written by an older version does
    not, and a reader takes it as empty."""
    return sa.inspect(engine).has_table(table.name)


def _connect_args(url: str) -> dict[str, Any]:
    return {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}


def now() -> datetime:
    """The time every table stores: naive UTC (SQLite keeps no zone)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)
