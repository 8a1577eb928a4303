"""One line for each way a results DB URL cannot be used, naming the URL and what to do.

``url_problem`` is the config's check (syntax and dialect); ``storage_errors`` turns what only
opening the DB finds (a driver that is not installed, a server that does not answer, a file
that is not SQLite, a read-only DB) into a :class:`StorageError`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from tuner.errors import StorageError

EXAMPLES = "sqlite:///results.db or postgresql://USER@HOST/DB"
# What installs a driver, where it is not simply its module's name.
INSTALL = {"psycopg2": "pip install 'dflash-tune[postgres]'", "mysqldb": "pip install mysqlclient"}
# Substrings of a DB-API error's first line -> what to do about it.
REMEDIES = {
    "readonly database": "the DB is read-only: make it writable, or point --storage at a copy",
    "file is not a database": "not a SQLite database: point --storage at a new file or a results DB",
    "unable to open database file": "SQLite cannot open it: is its folder there and writable?",
    "database or disk is full": "the disk is full: free space, or point --storage elsewhere",
    "no such column": "its tables are not the ones dflash-tune writes (another program's "
                      "schema, or damaged); point --storage at the DB `dflash-tune run` wrote",
}


def url_problem(url: str) -> str | None:
    """What is wrong with ``url`` that needs no connection to see, or None."""
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        return f"{url!r} is not a database URL; write e.g. {EXAMPLES}"
    shown = shown_url(url)
    try:
        parsed.get_dialect()
    except sa.exc.NoSuchModuleError:
        name = parsed.get_backend_name()
        close = difflib.get_close_matches(name, sa.dialects.__all__, n=1)
        hint = f"did you mean {close[0]}://?" if close else f"write e.g. {EXAMPLES}"
        return f"{shown}: unknown database {name!r}; {hint}"
    if _in_memory(parsed):
        return (f"{shown} is an in-memory SQLite DB, gone when the command ends with every "
                f"trial in it; name a file, e.g. sqlite:///results.db")
    return None


def _in_memory(parsed: sa.engine.URL) -> bool:
    """SQLite without a file: no path, :memory:, or a URI filename in memory mode."""
    if parsed.get_backend_name() != "sqlite":
        return False
    path = parsed.database or ""
    return (path in ("", ":memory:") or path.startswith("file::memory:")
            or "mode=memory" in path or parsed.query.get("mode") == "memory")


def driver_problem(url: str) -> str | None:
    """Why the driver ``url`` names cannot be imported, or None. Checked when the DB is opened,
    not in the config: a config may name a driver only the machine that runs it has."""
    parsed = sa.engine.make_url(url)
    try:
        parsed.get_dialect().import_dbapi()
    except ImportError as err:
        driver = parsed.get_driver_name()
        install = INSTALL.get(driver, f"pip install {err.name or driver}")
        return f"{shown_url(url)}: its driver is not installed ({err}); {install}, or use {EXAMPLES}"
    return None


@contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """Errors opening or writing the DB at ``url`` become one :class:`StorageError` line."""
    try:
        yield
    except StorageError:
        raise
    except ImportError as err:
        problem = driver_problem(url)
        if problem is None:
            raise
        raise StorageError(f"storage {problem}") from err
    except (FileNotFoundError, NotADirectoryError) as err:  # the SQLite folder lock's open
        raise StorageError(f"storage {shown_url(url)}: folder {err.filename} does not exist; "
                           "create it or point --storage elsewhere") from err
    except Exception as err:
        dbapi = _dbapi_error(err)
        if dbapi is None:
            raise
        raise StorageError(f"storage {shown_url(url)}: {_remedy(url, dbapi)}") from err


def _remedy(url: str, err: sa.exc.DBAPIError) -> str:
    first = (str(err.orig).strip().splitlines() or [type(err.orig).__name__])[0]
    for needle, remedy in REMEDIES.items():
        if needle in first:
            return f"{remedy} ({first})"
    if isinstance(err, sa.exc.OperationalError) and not url.startswith("sqlite"):
        return (f"cannot connect ({first}); start the database server, or fix the host, port "
                "or credentials in --storage")
    return first


def _dbapi_error(err: BaseException | None) -> sa.exc.DBAPIError | None:
    """The DB-API error behind ``err``: Optuna re-raises some as its own (StorageInternalError)."""
    while err is not None and not isinstance(err, sa.exc.DBAPIError):
        err = err.__cause__
    return err


def shown_url(url: str) -> str:
    """``url`` as the user wrote it, its password masked."""
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        return repr(url)
    return repr(url if parsed.password is None else parsed.render_as_string(hide_password=True))
