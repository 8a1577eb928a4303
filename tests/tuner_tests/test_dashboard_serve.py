"""`dflash-tune dashboard --serve` as a real process under a burst of readers, idle connections
and readers that leave mid-download."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import UNBOUNDED_TTFT
from cli_helpers import write_config

from tuner.config import load_config
from tuner.dashboard.serve import TIMEOUT_S
from tuner.runner import run_study


class Served:
    def __init__(self, port: int, log: Path) -> None:
        self.port, self.log = port, log

    def get(self, timeout: float = 60.0) -> bytes:
        """The whole answer to one GET of the page (HTTP/1.0: the server closes when done)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(self.request())
            return _read_all(sock)

    def request(self) -> bytes:
        return f"GET / HTTP/1.0\r\nHost: 127.0.0.1:{self.port}\r\n\r\n".encode()

    def logged(self) -> str:
        return self.log.read_text()


def _read_all(sock: socket.socket) -> bytes:
    data = bytearray()
    while chunk := sock.recv(1 << 16):
        data += chunk
    return bytes(data)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("served")
    config = write_config(folder, study={"name": "served", "n_trials": 4},
                          workload=UNBOUNDED_TTFT)
    run_study(load_config(config))
    port, log = _free_port(), folder / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tuner", "dashboard", "-c", str(config),
                                 "--serve", "--port", str(port)], cwd=folder, stderr=out)
    try:
        deadline = time.monotonic() + 120
        while "serving" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield Served(port, log)
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_hundred_concurrent_readers_are_all_answered_quickly(served):
    answers: list[bytes | Exception] = []

    def read() -> None:
        try:
            answers.append(served.get())
        except OSError as err:  # a reset or a refused connection
            answers.append(err)

    readers = [threading.Thread(target=read) for _ in range(100)]
    began = time.monotonic()
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    took = time.monotonic() - began
    failed = [a for a in answers if not isinstance(a, bytes) or not a.startswith(b"HTTP/1.0 200")]
    assert not failed and len(answers) == 100, failed[:3]
    # A listen backlog of 5 dropped most of a burst: clients retried after 1, 3, 7... s and
    # some were reset (100 s and more for such a burst). Here a second or two.
    assert took < 30, took


def test_idle_connections_block_no_one_and_are_closed_after_the_timeout(served):
    idle = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(20)]
    idle[0].sendall(b"GET / HTTP/1.1\r\n")  # half a request
    try:
        began = time.monotonic()
        assert served.get(timeout=10).startswith(b"HTTP/1.0 200")
        assert time.monotonic() - began < 10
        for sock in idle:
            sock.settimeout(TIMEOUT_S + 20)
            assert sock.recv(1) == b""  # the server hung up: its thread is free again
        assert time.monotonic() - began < TIMEOUT_S + 20
    finally:
        for sock in idle:
            sock.close()


def test_readers_that_leave_mid_download_log_nothing(served):
    before = served.logged()
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", served.port))
        sock.sendall(served.request())
        sock.recv(1)  # the answer has begun; the page is megabytes, so most of it is unsent
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # with linger 0: a reset, as a closed browser tab sends
    assert served.get().startswith(b"HTTP/1.0 200")  # the server is still fine
    time.sleep(0.5)
    new = served.logged()[len(before):]
    assert "Traceback" not in new and new.count("\n") <= 1, new


def test_serving_a_study_writes_nothing_to_its_db(tmp_path):
    """The served report only reads: a study DB that lacks a table added later (the nightly
    tables here) is left as it is."""
    import sqlalchemy as sa

    from tuner.dashboard.serve import ReportCache

    config = write_config(tmp_path, study={"name": "read", "n_trials": 2},
                          workload=UNBOUNDED_TTFT)
    cfg = load_config(config)
    run_study(cfg)
    url = cfg.study.storage
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE IF EXISTS dflash_tune_nightly"))
    before = set(sa.inspect(engine).get_table_names())
    engine.dispose()
    ReportCache.primed(url, "read", 5).engine.dispose()
    after = sa.inspect(sa.create_engine(url)).get_table_names()
    assert set(after) == before
