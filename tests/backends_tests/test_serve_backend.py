"""The `serve` backend launches real `dflash-tune serve` processes with the tiny pair: a good
launch is measured with run-local acceptance; each fault becomes a classified row, and no
process is ever left behind."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import replace

import httpx
import psutil
import pytest

from backends import Deployment, FailureClass, LaunchParams, Workload, get_backend
from backends.flags import LaunchTarget
from dflash_core.training.pair import ensure_pair

PAIR = ensure_pair()
TARGET = LaunchTarget(str(PAIR / "target"), str(PAIR / "drafter"), context_length=128)
DEPLOYMENT = Deployment(gpu="cpu", gpus=1, model=str(PAIR / "target" / "config.json"),
                        target=TARGET, engine="dflash")
WORKLOAD = Workload(input_len=32, output_len=16, concurrency=(1, 4))
DFLASH = LaunchParams(tp_size=1, cuda_graph=False, max_running_requests=4,
                      speculative_algorithm="dflash")


def _children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.status() != "zombie"]


def _backend(deployment: Deployment = DEPLOYMENT, **options):
    return get_backend("serve", deployment, requests_per_level=6, **options)


@pytest.fixture(autouse=True)
def no_leftovers():
    yield
    assert _children() == []


def test_a_good_launch_is_measured_with_run_local_acceptance():
    rows = _backend().measure(DFLASH, WORKLOAD)
    assert [m.concurrency for m in rows] == [1, 4] and all(m.ok for m in rows)
    assert all(m.accept_len_mean > 1.5 for m in rows)  # the trained drafter drafts
    assert all(m.ttft_p50_ms > 0 and m.output_tok_s > 0 for m in rows)


def test_a_bad_flag_is_invalid_config():
    bad = replace(DEPLOYMENT, target=replace(TARGET, extra_args=("--bogus",)))
    rows = _backend(bad).measure(DFLASH, WORKLOAD)
    assert {m.failure for m in rows} == {FailureClass.INVALID_CONFIG}
    assert "bogus" in rows[0].log_excerpt


def test_a_cache_that_cannot_be_allocated_is_oom():
    rows = _backend().measure(replace(DFLASH, max_running_requests=10**9), WORKLOAD)
    assert {m.failure for m in rows} == {FailureClass.OOM}


def test_a_server_that_is_not_healthy_in_time_is_a_timeout():
    rows = _backend(start_timeout_s=0.3).measure(DFLASH, WORKLOAD)
    assert {m.failure for m in rows} == {FailureClass.TIMEOUT}


def test_a_server_killed_under_load_is_a_crash():
    killer = threading.Thread(target=_kill_server_once_serving, daemon=True)
    killer.start()
    rows = _backend().measure(DFLASH, Workload(32, 64, (1, 4)))
    killer.join()
    assert {m.failure for m in rows} == {FailureClass.CRASH}


def _kill_server_once_serving() -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for proc in _children():
            cmd = proc.cmdline()
            if "backends.dflash_server" in cmd and "--port" in cmd:
                port = cmd[cmd.index("--port") + 1]
                if _healthy(port):
                    time.sleep(0.5)  # well inside the first level's requests
                    proc.kill()
                    return
        time.sleep(0.05)


def _healthy(port: str) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_port_someone_else_holds_is_port_in_use(monkeypatch):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    monkeypatch.setattr("backends.serving.free_port", lambda host: holder.getsockname()[1])
    try:
        rows = _backend().measure(DFLASH, WORKLOAD)
    finally:
        holder.close()
    assert {m.failure for m in rows} == {FailureClass.PORT_IN_USE}


def test_configurations_the_server_cannot_express_never_launch():
    rows = _backend().measure(replace(DFLASH, dp_size=2), WORKLOAD)  # TP and EP it can
    assert {m.failure for m in rows} == {FailureClass.UNSUPPORTED}
