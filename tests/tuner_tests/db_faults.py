"""The real CLI with a SQLite DB that fails mid-run: ``python db_faults.py full|read-only ARGS``.

``full``: every connection may grow the DB file to ~60 pages (SQLite's own disk-full error).
``read-only``: from the fourth trial written on, the connection is read-only (``PRAGMA
query_only``, which holds for root too, where a chmod would not).
``nightly-read-only``: read-only from the first nightly row written on.
"""

from __future__ import annotations

import sys

import sqlalchemy as sa
from sqlalchemy import event

FULL_PAGES = 60
WRITABLE_TRIALS = 3


def _full(dbapi_conn, record) -> None:
    dbapi_conn.execute(f"PRAGMA max_page_count = {FULL_PAGES}")


def _read_only_later(table: str = "dflash_tune_trials", writable: int = WRITABLE_TRIALS) -> None:
    written = 0

    @event.listens_for(sa.Engine, "before_cursor_execute")
    def _turn(conn, cursor, statement, parameters, context, executemany) -> None:
        nonlocal written
        if statement.startswith(f"INSERT INTO {table}"):
            written += 1
            if written > writable:
                cursor.execute("PRAGMA query_only = 1")


if __name__ == "__main__":
    fault = sys.argv.pop(1)
    if fault == "full":
        event.listen(sa.Engine, "connect", _full)
    elif fault == "nightly-read-only":
        _read_only_later("dflash_tune_nightly", 0)
    else:
        _read_only_later()
    from tuner.cli import main

    sys.argv[0] = "dflash-tune"
    main()
