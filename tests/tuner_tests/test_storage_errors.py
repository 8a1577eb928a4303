"""Every results DB that cannot be used is one line on stderr naming its URL and what to do,
exit 2: a malformed URL, an unknown dialect, a missing driver, a server that is down, a file that
is not SQLite, a read-only DB, a missing folder, an in-memory DB, a disk that fills up mid-run,
a table of another schema (naming the table and the row). `run` uses a SQLite file with other
tables; the commands that only read never write to any DB."""

from __future__ import annotations

import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import UNBOUNDED_TTFT, cli
from cli_helpers import write_config

HERE = Path(__file__).parent


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
    write_config(tmp_path, study={"n_trials": 3}, tuning={"level_search": False})
    result = cli("run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with sqlite3.connect(tmp_path / "results.db") as db:
        assert db.execute("select body from notes").fetchall() == [("keep me",)]
        assert db.execute("select count(*) from dflash_tune_trials where measured").fetchone() \
            == (3,)


def _fault_run(tmp_path: Path, fault: str) -> subprocess.CompletedProcess:
    write_config(tmp_path, study={"n_trials": 30})
    return subprocess.run([sys.executable, str(HERE / "db_faults.py"), fault, "run"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("fault, says", [
    ("full", "the disk is full: free space, or point --storage elsewhere"),
    ("read-only", "the DB is read-only: make it writable"),
])
def test_a_db_that_fails_mid_run_is_one_line_exit_2(tmp_path, fault, says):
    result = _fault_run(tmp_path, fault)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "failed with" not in result.stderr
    [error] = [line for line in result.stderr.splitlines() if "trials" not in line]
    assert error.startswith(f"error: storage 'sqlite:///{tmp_path / 'results.db'}': {says}")


def test_a_db_that_turns_read_only_during_nightly_is_one_line_exit_2(tmp_path):
    write_config(tmp_path, study={"n_trials": 8}, workload=UNBOUNDED_TTFT)
    assert cli("run", cwd=tmp_path).returncode == 0
    result = subprocess.run([sys.executable, str(HERE / "db_faults.py"), "nightly-read-only",
                             "nightly", "--repeats", "1", "--explore", "0"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"error: storage 'sqlite:///{tmp_path / 'results.db'}': the DB is read-only")


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:",
                                 "sqlite:///file::memory:?uri=true"])
def test_an_in_memory_db_is_refused_in_one_line(tmp_path, url):
    for command in ("run", "best"):
        _one_line_exit_2(cli(command, "--storage", url, "--trials", "2", cwd=tmp_path)
                         if command == "run" else cli(command, "--storage", url, cwd=tmp_path),
                         f"'{url}' is an in-memory SQLite DB", "name a file")
    assert not list(tmp_path.iterdir())


def _tables(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [r[0] for r in db.execute("select name from sqlite_master where type='table'")]


def test_read_only_commands_write_nothing_to_a_db_that_is_not_a_study_db(tmp_path):
    with sqlite3.connect(tmp_path / "notes.db") as db:
        db.execute("create table notes (body text)")
    before = (tmp_path / "notes.db").read_bytes()
    url = f"sqlite:///{tmp_path / 'notes.db'}"
    for command in ("best", "export", "dashboard"):
        _one_line_exit_2(cli(command, "--storage", url, cwd=tmp_path),
                         f"'{url}' is not a dflash-tune results DB", "point --storage at")
    assert _tables(tmp_path / "notes.db") == ["notes"]
    assert (tmp_path / "notes.db").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]  # no report either


@pytest.fixture(scope="module")
def study_db(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("study")
    write_config(folder, study={"n_trials": 3})
    assert cli("run", cwd=folder).returncode == 0
    return folder / "results.db"


@pytest.mark.parametrize("damage, says", [
    ("alter table dflash_tune_measurements drop column tpot_p50_ms",
     "its tables are not the ones dflash-tune writes (another program's schema, or damaged); "
     "point --storage at the DB `dflash-tune run` wrote (no such column: "
     "dflash_tune_measurements.tpot_p50_ms)"),
    ("update dflash_tune_measurements set output_tok_s = 'fast' where trial_number = 1",
     "table dflash_tune_measurements, study 'pcie8-kimi-sglang', trial 1, concurrency 1: "
     "output_tok_s holds 'fast', not a number"),
    ("update dflash_tune_trials set params_json = '{not json' where trial_number = 1",
     "table dflash_tune_trials, study 'pcie8-kimi-sglang', trial 1: params_json is not JSON"),
    ("update dflash_tune_trials set params_json = '[1, 2]' where trial_number = 1",
     "table dflash_tune_trials, study 'pcie8-kimi-sglang', trial 1: params_json holds a JSON "
     "list, not a dict"),
    ("update dflash_tune_studies set config_json = '[1'",
     "table dflash_tune_studies, study 'pcie8-kimi-sglang': config_json is not JSON"),
])
def test_a_db_of_another_schema_names_the_table_and_row(tmp_path, study_db, damage, says):
    shutil.copy(study_db, tmp_path / "results.db")
    with sqlite3.connect(tmp_path / "results.db") as db:
        db.execute(damage)
    write_config(tmp_path)
    for command in ("best", "export", "dashboard"):
        _one_line_exit_2(cli(command, cwd=tmp_path), f"'sqlite:///{tmp_path / 'results.db'}'",
                         says)


def test_a_log_with_a_nul_character_is_stored_in_postgresql(tmp_path):
    """PostgreSQL refuses NUL in a text column; a server's log excerpt may hold one."""
    from pg_server import postgres

    from tuner import records

    with postgres() as server:  # skips without PostgreSQL or psycopg2
        url = server.create_database("nul").replace("postgresql://", "postgresql+psycopg2://")
        db = records.connect(url)
        record = records.TrialRecord(0, "model", {}, "crash", True, "serve\x00x", {},
                                     "Segmentation fault\x00\x00", {})
        records.save_trial(db, "s", record, [])
        [back] = records.load_trials(db, "s")
        db.dispose()
    assert (back.command, back.log_excerpt) == ("serve\ufffdx", "Segmentation fault\ufffd\ufffd")
