"""Named locks shared by every worker on one results DB, each held for milliseconds.

Workers take one to create tables and enqueue the baseline, and one to count the study and start
a trial as a single step, so that several workers on one study stop at exactly ``n_trials``
(``tuner.budget``). PostgreSQL: an advisory lock inside a transaction, so a worker that dies
holding it frees it with its connection. SQLite: ``flock`` on the DB's folder, which covers
every worker that can share a SQLite file (one machine). Other databases get no lock: there one
worker per study is exact (docs/SCALE_OUT.md).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

import sqlalchemy as sa

# The lock is held for milliseconds (a count, an Optuna ask, a mark); far longer means its holder
# is gone.
HOLDER_GONE_S = 120


class ClaimLock:
    """Re-acquirable, and ``release`` is a no-op when not held (it may be released early)."""

    def acquire(self) -> None:
        pass

    def release(self) -> None:
        pass

    def __enter__(self) -> ClaimLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class _PostgresLock(ClaimLock):
    def __init__(self, engine: sa.Engine, key: int) -> None:
        self._engine, self._key = engine, key
        self._conn: sa.Connection | None = None

    def acquire(self) -> None:
        conn = self._engine.connect()
        # A holder whose machine vanished keeps its TCP session open for hours (keepalive
        # defaults); the server ends its idle transaction, and so frees the lock, after this.
        conn.execute(sa.text(f"SET LOCAL idle_in_transaction_session_timeout = "
                             f"{HOLDER_GONE_S * 1000}"))
        # A transaction-level lock: it ends with the transaction, however the connection ends.
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(self._key)))
        self._conn = conn

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.close()  # rolls the transaction back, which frees the lock
        except sa.exc.DBAPIError:
            pass  # the server already ended the session (HOLDER_GONE_S): the lock is free


class _FolderLock(ClaimLock):
    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self._folder, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing drops the flock


def claim_lock(url: str, name: str) -> ClaimLock:
    """The lock called ``name`` on the DB at ``url``."""
    parsed = sa.engine.make_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        # No pool: a released lock's connection is closed, not kept idle for the whole run.
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        return _PostgresLock(engine, _key(name))
    if backend == "sqlite" and parsed.database not in (None, "", ":memory:"):
        # The DB's folder, whatever the name: it leaves no lock file behind, and SQLite's own
        # locks (fcntl, on the DB file) are untouched. It is coarse, but the locks never nest and
        # are held for milliseconds.
        return _FolderLock(Path(os.path.realpath(_sqlite_path(parsed))).parent)
    return ClaimLock()


def _sqlite_path(parsed: sa.URL) -> str:
    """The file of a SQLite URL, also in its URI form (``sqlite:///file:PATH?mode=ro&uri=true``)."""
    path = parsed.database or ""
    if parsed.query.get("uri") == "true" and path.startswith("file:"):
        return path[len("file:"):]
    return path


def _key(name: str) -> int:
    # pg_advisory_xact_lock takes a signed 64-bit key.
    raw = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(raw, "big", signed=True)
