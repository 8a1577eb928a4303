"""Every results DB that cannot be used is one line on stderr naming its URL and what to do,
exit 2: a malformed URL, an unknown dialect, a missing driver, a server that is down, a file that
is not SQLite, a read-only DB, a missing folder. A SQLite file with other tables is just used."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import pytest
from cli_helpers import cli
from cli_helpers import write_config


def _one_line_exit_2(result, *needles: str) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("url, hint", [
    ("sqlit:///x.db", "did you mean sqlite://"),
    ("x.db", "is not a database URL; write e.g. sqlite:///"),
    ("mysql://user@localhost/db", "driver is not installed (No module named 'MySQLdb'); "
                                  "pip install mysqlclient"),
])
def test_a_bad_storage_url_is_one_line_exit_2(tmp_path, url, hint):
    for command in ("run", "best"):
        result = cli(command, "--storage", url, cwd=tmp_path)
        _one_line_exit_2(result, f"'{url}'", hint)
    assert not list(tmp_path.iterdir())  # nothing was created


def test_a_postgres_server_that_is_down_is_one_line_exit_2(tmp_path):
    pytest.importorskip("psycopg2")
    url = f"postgresql://tuner:secret@127.0.0.1:{_free_port()}/results"
    line = _one_line_exit_2(cli("run", "--storage", url, "--trials", "2", cwd=tmp_path),
                            "cannot connect", "start the database server", "127.0.0.1")
    assert "secret" not in line  # the password is masked


def test_a_file_that_is_not_sqlite_is_one_line_exit_2(tmp_path):
    (tmp_path / "results.db").write_text("these are my notes, not a database\n" * 20)
    write_config(tmp_path)
    for command in ("run", "best", "dashboard"):
        _one_line_exit_2(cli(command, cwd=tmp_path), "results.db", "not a SQLite database")


def test_a_read_only_db_is_one_line_exit_2(tmp_path):
    write_config(tmp_path, study={"n_trials": 2})
    assert cli("run", cwd=tmp_path).returncode == 0
    # SQLite's read-only mode: a chmod would not stop root, which the tests may run as.
    url = f"sqlite:///file:{tmp_path / 'results.db'}?mode=ro&uri=true"
    _one_line_exit_2(cli("run", "--storage", url, "--trials", "4", cwd=tmp_path),
                     url, "read-only")


def test_a_missing_db_folder_is_one_line_exit_2(tmp_path):
    url = f"sqlite:///{tmp_path / 'absent' / 'results.db'}"
    _one_line_exit_2(cli("run", "--storage", url, "--trials", "2", cwd=tmp_path),
                     url, f"folder {tmp_path / 'absent'} does not exist")


def test_a_sqlite_file_with_other_tables_is_used_and_they_are_kept(tmp_path: Path):
    with sqlite3.connect(tmp_path / "results.db") as db:
        db.execute("create table notes (body text)")
        db.execute("insert into notes values ('keep me')")
    write_config(tmp_path, study={"n_trials": 3})
    result = cli("run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with sqlite3.connect(tmp_path / "results.db") as db:
        assert db.execute("select body from notes").fetchall() == [("keep me",)]
        assert db.execute("select count(*) from dflash_tune_trials where measured").fetchone() \
            == (3,)
