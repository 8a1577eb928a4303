"""A throwaway PostgreSQL cluster for tests: its own temp dir, a free port, stopped at the end.

PostgreSQL refuses to run as root, so as root the cluster belongs to (and runs as) the
``postgres`` user the Debian package creates, or ``nobody``. Tests skip when the server binaries
or psycopg2 are missing; CI installs both (.ci/run, the ``postgres`` extra).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

SUPERUSER = "dflash"


@dataclass(slots=True)
class PgServer:
    port: int

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A fresh database on this server; returns its URL."""
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=SUPERUSER,
                                dbname="postgres")
        conn.autocommit = True  # CREATE DATABASE refuses to run inside a transaction
        try:
            conn.cursor().execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.url(name)


def server_binaries() -> Path:
    """The newest installed server's bin dir, or skip the test."""
    pytest.importorskip("psycopg2", reason="psycopg2 missing: pip install -e '.[postgres]'")
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]))
    initdb = found[-1] if found else shutil.which("initdb")
    if initdb is None:
        pytest.skip("PostgreSQL server binaries missing (Debian: apt-get install postgresql)")
    return Path(initdb).parent


@contextmanager
def postgres() -> Iterator[PgServer]:
    """Start a cluster (initdb + pg_ctl start), yield it, stop it immediately."""
    bindir = server_binaries()
    root = Path(tempfile.mkdtemp(prefix="dflash-pg-"))
    user = _unprivileged_user()
    if user:
        os.chown(root, user.pw_uid, user.pw_gid)
    data, port = root / "data", _free_port()
    try:
        _as(user, root, [bindir / "initdb", "-D", data, "-U", SUPERUSER, "--auth=trust",
                         "--no-sync", "-E", "UTF8"])
        # Throwaway data: no fsync. The socket lives in the temp dir, not /var/run/postgresql.
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        _as(user, root, [bindir / "pg_ctl", "-D", data, "-o", options, "-l", root / "log",
                         "-w", "-t", "60", "start"])
        yield PgServer(port=port)
    finally:
        if (data / "postmaster.pid").exists():
            _as(user, root, [bindir / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"])
        shutil.rmtree(root, ignore_errors=True)


def _unprivileged_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    pytest.skip("running as root with no unprivileged user for PostgreSQL")


def _as(user: pwd.struct_passwd | None, cwd: Path, argv: list) -> None:
    """Run ``argv`` as ``user``, from a folder it can enter (the checkout may be root-only)."""
    prefix = ["runuser", "-u", user.pw_name, "--"] if user else []
    result = subprocess.run([*prefix, *map(str, argv)], cwd=cwd, capture_output=True, text=True,
                            timeout=120)
    if result.returncode:
        raise RuntimeError(f"{argv[0]} failed: {result.stdout}{result.stderr}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
