"""Reading a stored value back, or one line that names where it is wrong.

A results DB outlives the program that wrote it and can be edited by hand or by another tool: a
column that is missing, text where a metric belongs or JSON cut short is the user's to fix (or
to point --storage elsewhere), so each becomes a StorageError naming the DB, the table, the row
(study and trial) and the column, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from tuner.errors import StorageError
from tuner.storage import storage_errors

FIX = "written by another program, or damaged: repair or delete that row, or use another DB"


@contextmanager
def reading(engine: sa.Engine) -> Iterator[None]:
    """A query's DB errors (a missing table or column) as one line naming the DB."""
    with storage_errors(engine.url.render_as_string(hide_password=False)):
        yield


def damaged(engine: sa.Engine, table: sa.Table, where: str, problem: str) -> StorageError:
    url = engine.url.render_as_string(hide_password=True)
    return StorageError(f"storage {url!r}: table {table.name}, {where}: {problem}; {FIX}")


def json_value(engine: sa.Engine, table: sa.Table, where: str, row: Any, column: str,
               kind: type = dict) -> Any:
    """Column ``column`` of ``row`` parsed as JSON of type ``kind`` (None stays None)."""
    text = row[column]
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as err:
        raise damaged(engine, table, where, f"{column} is not JSON ({err})") from None
    if not isinstance(value, kind):
        raise damaged(engine, table, where,
                      f"{column} holds a JSON {type(value).__name__}, not a {kind.__name__}")
    return value


def numbers(engine: sa.Engine, table: sa.Table, where: str, row: Any,
            columns: tuple[str, ...]) -> None:
    """Refuse a value in a numeric column that is no number (SQLite stores any type)."""
    for column in columns:
        value = row[column]
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, int | float)):
            raise damaged(engine, table, where, f"{column} holds {value!r}, not a number")
