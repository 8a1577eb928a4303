"""backends.server against a real child HTTP server (fake_servers/fake_server.py) that misbehaves
on request: every failure is classified, and no process of the server's group survives."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest

from backends.contract import FailureClass
from backends.server import ServerError
from backends.server import ServerSpec
from backends.server import classify
from backends.server import free_port
from backends.server import group_alive
from backends.server import launched

FAKE = Path(__file__).parent / "fake_servers" / "fake_server.py"


def fake_spec(tmp_path: Path, mode: str, *extra: str, port: int | None = None,
              **overrides) -> ServerSpec:
    port = port or free_port()
    argv = [sys.executable, str(FAKE), "--port", str(port), "--mode", mode, *extra]
    settings = {"start_timeout_s": 10.0, "stop_timeout_s": 2.0,
                "log_path": tmp_path / "server.log"} | overrides
    return ServerSpec(argv=argv, port=port, **settings)


def logged_pid(log_path: Path, label: str) -> int:
    """A pid the fake server printed (`fake server pid=N`, `grandchild pid N`, ...)."""
    match = re.search(rf"{label}[ =](\d+)", log_path.read_text())
    assert match, f"{label!r} not in log:\n{log_path.read_text()}"
    return int(match.group(1))


def leader_and_grandchild(log_path: Path) -> tuple[int, int]:
    return logged_pid(log_path, "pid"), logged_pid(log_path, "grandchild pid")


def is_live(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_group_gone(pgid: int, *pids: int) -> None:
    assert group_alive(pgid) is False
    assert [pid for pid in (pgid, *pids) if is_live(pid)] == []


def launch_error(spec: ServerSpec) -> ServerError:
    with pytest.raises(ServerError) as caught, launched(spec):
        pytest.fail("launched should not have yielded")
    return caught.value


def wait_until(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


# --- a healthy server -----------------------------------------------------------------------


def test_healthy_server_serves_and_teardown_kills_server_and_grandchild(tmp_path):
    spec = fake_spec(tmp_path, "ok", "--spawn-child")
    with launched(spec) as server:
        assert httpx.get(server.base_url + "/health", trust_env=False).status_code == 200
        models = httpx.get(server.base_url + "/v1/models", trust_env=False).json()
        assert models["data"][0]["id"] == "fake-model"
        assert server.pgid == server.pid == os.getpgid(server.pid)
        assert server.alive() and group_alive(server.pgid)
        server.check()  # alive: no error
        grandchild = logged_pid(server.log_path, "grandchild pid")
        assert is_live(grandchild) and os.getpgid(grandchild) == server.pgid
    assert_group_gone(server.pgid, grandchild)


def test_slow_start_answering_503_is_waited_for(tmp_path):
    started = time.monotonic()
    with launched(fake_spec(tmp_path, "slow-start", "--delay", "1.0")) as server:
        assert time.monotonic() - started >= 1.0
        assert "503" in server.log_excerpt()
    assert_group_gone(server.pgid)


def test_later_health_path_answers_when_earlier_one_is_missing(tmp_path):
    spec = fake_spec(tmp_path, "ok", health_paths=("/missing", "/v1/models"))
    with launched(spec) as server:
        assert '"GET /v1/models' in server.log_excerpt()
    assert_group_gone(server.pgid)


# --- failing to come up ---------------------------------------------------------------------


def test_bad_flag_is_invalid_config_with_usage_in_excerpt(tmp_path):
    spec = fake_spec(tmp_path, "bad-flag")
    error = launch_error(spec)
    assert error.failure is FailureClass.INVALID_CONFIG
    assert "unrecognized arguments: --bogus" in error.log_excerpt
    assert_group_gone(logged_pid(spec.log_path, "pid"))


def test_oom_message_at_start_is_oom(tmp_path):
    spec = fake_spec(tmp_path, "oom", "--spawn-child")
    error = launch_error(spec)
    assert error.failure is FailureClass.OOM
    assert "CUDA out of memory" in error.log_excerpt
    assert_group_gone(*leader_and_grandchild(spec.log_path))


def test_unexplained_exit_at_start_is_crash(tmp_path):
    spec = fake_spec(tmp_path, "exit-at-start")
    error = launch_error(spec)
    assert error.failure is FailureClass.CRASH
    assert "gave up" in error.log_excerpt
    assert_group_gone(logged_pid(spec.log_path, "pid"))


def test_reused_log_path_is_truncated_so_old_errors_do_not_classify(tmp_path):
    spec = fake_spec(tmp_path, "bad-flag")
    spec.log_path.write_text("torch.OutOfMemoryError: CUDA out of memory (previous run)\n")
    assert launch_error(spec).failure is FailureClass.INVALID_CONFIG


def test_never_healthy_times_out_and_is_killed(tmp_path):
    spec = fake_spec(tmp_path, "hang", "--spawn-child", start_timeout_s=1.0)
    started = time.monotonic()
    error = launch_error(spec)
    assert error.failure is FailureClass.TIMEOUT
    assert "mode=hang" in error.log_excerpt
    assert time.monotonic() - started < 1.0 + spec.stop_timeout_s
    assert_group_gone(*leader_and_grandchild(spec.log_path))


def test_missing_executable_is_a_server_error_not_an_oserror(tmp_path):
    spec = ServerSpec(argv=[str(tmp_path / "no-such-server")], port=free_port())
    assert launch_error(spec).failure is FailureClass.CRASH


# --- dying while in use ---------------------------------------------------------------------


def test_crash_mid_run_is_raised_by_check_as_crash(tmp_path):
    spec = fake_spec(tmp_path, "crash-after-health", "--spawn-child", "--delay", "0.2")
    with pytest.raises(ServerError) as caught, launched(spec) as server:
        server.check()
        assert wait_until(lambda: not server.alive())
        assert server.exit_code() == -signal.SIGKILL
        server.check()
    assert caught.value.failure is FailureClass.CRASH
    assert "crashing now" in caught.value.log_excerpt
    assert_group_gone(server.pgid, logged_pid(spec.log_path, "grandchild pid"))


def test_keyboard_interrupt_in_body_propagates_and_group_is_gone(tmp_path):
    spec = fake_spec(tmp_path, "ok", "--spawn-child")
    with pytest.raises(KeyboardInterrupt), launched(spec) as server:
        raise KeyboardInterrupt
    assert_group_gone(server.pgid, logged_pid(server.log_path, "grandchild pid"))


def test_server_ignoring_sigterm_is_killed_after_stop_timeout(tmp_path):
    spec = fake_spec(tmp_path, "ignore-term", "--spawn-child", stop_timeout_s=0.5)
    with launched(spec) as server:  # healthy means the SIG_IGN handler is installed
        leaving = time.monotonic()
    assert time.monotonic() - leaving >= 0.5
    assert_group_gone(server.pgid, logged_pid(server.log_path, "grandchild pid"))


# --- the port -------------------------------------------------------------------------------


@pytest.mark.parametrize("listen", [True, False], ids=["listening", "bound-only"])
def test_taken_port_is_port_in_use_without_starting_anything(tmp_path, listen):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        if listen:
            holder.listen()
        spec = fake_spec(tmp_path, "ok", port=holder.getsockname()[1])
        error = launch_error(spec)
    assert error.failure is FailureClass.PORT_IN_USE
    assert not spec.log_path.exists()  # never launched


def _start_foreign(port: int) -> subprocess.Popen:
    argv = [sys.executable, str(FAKE), "--port", str(port), "--mode", "ok"]
    foreign = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/health"

    def healthy() -> bool:
        try:
            return httpx.get(url, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    assert wait_until(healthy)
    return foreign


def test_foreign_server_on_the_port_is_port_in_use_and_left_alone(tmp_path):
    port = free_port()
    foreign = _start_foreign(port)
    try:
        error = launch_error(fake_spec(tmp_path, "ok", port=port))
        assert error.failure is FailureClass.PORT_IN_USE
        assert foreign.poll() is None  # not ours to kill
    finally:
        foreign.kill()
        foreign.wait()


def test_health_answered_from_outside_our_group_is_port_in_use(tmp_path):
    """The launcher hands the port to a daemon in another session: a 200 is not proof it's ours."""
    pid_file = tmp_path / "daemon.pid"
    spec = fake_spec(tmp_path, "daemonize", "--pid-file", str(pid_file))
    try:
        error = launch_error(spec)
        assert error.failure is FailureClass.PORT_IN_USE
        assert "outside the group" in str(error)
        assert_group_gone(logged_pid(spec.log_path, "fake server pid"))
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


# --- helpers --------------------------------------------------------------------------------


def test_free_port_is_bindable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))


def test_group_alive_sees_own_group_and_not_a_finished_one():
    assert group_alive(os.getpgrp())
    child = subprocess.Popen(["true"], start_new_session=True)
    child.wait()
    assert group_alive(child.pid) is False


# --- classify: the table --------------------------------------------------------------------

OOM = FailureClass.OOM
CASES = [
    # (exit code, log text, expected)
    (1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", OOM),
    (1, "RuntimeError: CUDA error: out of memory", OOM),
    (1, "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", OOM),
    (1, "ValueError: No available memory for the cache blocks. Try increasing memory", OOM),
    (-9, "worker died\ntorch.OutOfMemoryError: CUDA out of memory", OOM),  # OOM beats a kill
    (2, "error: unrecognized arguments: --x\nCUDA out of memory", OOM),  # OOM beats exit 2
    (1, "OSError: [Errno 98] Address already in use", FailureClass.PORT_IN_USE),
    (1, "ValueError: DDTree is not supported with pipeline parallelism",
     FailureClass.UNSUPPORTED),
    (1, "NotImplementedError: DFlash with fp4 KV cache", FailureClass.UNSUPPORTED),
    (1, "ValueError: Unknown speculative algorithm name DDTREE", FailureClass.UNSUPPORTED),
    (2, "usage: launch_server [-h]\nlaunch_server: error: unrecognized arguments: --enable-ep-moe",
     FailureClass.INVALID_CONFIG),
    (2, "error: argument --tp-size: invalid int value: 'x'", FailureClass.INVALID_CONFIG),
    (2, "error: argument --speculative-algorithm: invalid choice: 'DDTREE'",
     FailureClass.INVALID_CONFIG),
    (2, "", FailureClass.INVALID_CONFIG),  # argparse's exit status alone
    (1, "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig",
     FailureClass.INVALID_CONFIG),
    (1, 'File "server_args.py", line 9\nValueError: tp_size must divide the heads',
     FailureClass.INVALID_CONFIG),
    (1, "ConnectionResetError: [Errno 104] Connection reset by peer", FailureClass.TRANSIENT),
    (-11, "Fatal Python error: Segmentation fault", FailureClass.CRASH),
    (-9, "", FailureClass.CRASH),
    (1, "RuntimeError: NCCL error", FailureClass.CRASH),
    (0, "", FailureClass.CRASH),  # a server is not supposed to exit by itself
    (None, "", FailureClass.CRASH),
    # Warnings that mention unsupported things are not the failure.
    (1, "WARNING cuda graph is not supported here, falling back\nRuntimeError: boom",
     FailureClass.CRASH),
]


@pytest.mark.parametrize(("exit_code", "log_text", "expected"), CASES)
def test_classify_table(exit_code, log_text, expected):
    assert classify(exit_code, log_text) is expected


# --- a parent that dies without teardown -----------------------------------------------------

_PARENT = """
import sys, time
from pathlib import Path
from backends.server import ServerSpec, launched
argv, port, log = sys.argv[1:-2], int(sys.argv[-2]), Path(sys.argv[-1])
with launched(ServerSpec(argv, port, start_timeout_s=10.0, log_path=log)) as server:
    print(server.pid, flush=True)
    time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_dies_with_a_parent_killed_by_sigkill(tmp_path):
    """SIGKILL gives `launched` no chance to tear down: the kernel takes the server down."""
    port = free_port()
    argv = [sys.executable, str(FAKE), "--port", str(port), "--mode", "ok"]
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, *argv, str(port),
                               str(tmp_path / "server.log")], stdout=subprocess.PIPE,
                              cwd=Path(__file__).parents[2], env=killed_tuner_env(tmp_path))
    server_pid = int(parent.stdout.readline())
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert wait_until(lambda: not group_alive(server_pid), timeout_s=5.0)
    finally:
        if group_alive(server_pid):
            os.killpg(server_pid, signal.SIGKILL)
        parent.stdout.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def killed_tuner_env(tmp_path: Path) -> dict[str, str]:
    """A tuner to be SIGKILLed records its launch and makes its scratch folder under tmp_path."""
    (tmp_path / "tmp").mkdir()
    return {**os.environ, "DFLASH_TUNE_RUN_DIR": str(tmp_path / "run"),
            "TMPDIR": str(tmp_path / "tmp")}


def test_the_next_launch_kills_the_workers_and_scratch_a_sigkilled_tuner_left(tmp_path,
                                                                             monkeypatch):
    """PDEATHSIG takes the leader down with its tuner, not the worker it forked: the registry
    lets the next launch find that worker by its token and kill it, and nothing else, and
    remove the launch's scratch folder."""
    from backends import server_registry

    monkeypatch.setenv("DFLASH_TUNE_RUN_DIR", str(tmp_path / "run"))
    port, log = free_port(), tmp_path / "server.log"
    argv = [sys.executable, str(FAKE), "--port", str(port), "--mode", "ok", "--spawn-child"]
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, *argv, str(port), str(log)],
                              stdout=subprocess.PIPE, cwd=Path(__file__).parents[2],
                              env=killed_tuner_env(tmp_path))
    leader = int(parent.stdout.readline())
    worker = logged_pid(log, "grandchild pid")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert wait_until(lambda: not is_live(leader), timeout_s=5.0)
        assert is_live(worker)  # what PDEATHSIG does not reach
        assert server_registry.reap_stale() == [worker]
        assert wait_until(lambda: not is_live(worker), timeout_s=5.0)
        assert is_live(bystander.pid) and not (tmp_path / "run").exists()
        assert list((tmp_path / "tmp").iterdir()) == []  # the scratch folder went too
    finally:
        for pid in (leader, worker):
            if is_live(pid):
                os.kill(pid, signal.SIGKILL)
        bystander.kill()
        parent.stdout.close()


def test_a_live_tuners_server_is_not_reaped(tmp_path, monkeypatch):
    from backends import server_registry

    monkeypatch.setenv("DFLASH_TUNE_RUN_DIR", str(tmp_path / "run"))
    with launched(fake_spec(tmp_path, "ok", "--spawn-child")) as server:
        assert server_registry.reap_stale() == []
        assert server.alive() and len(list((tmp_path / "run").glob("*.json"))) == 1
    assert not (tmp_path / "run").exists()


# --- what a launch leaves in the temporary directory -----------------------------------------


@pytest.fixture
def own_tmp(tmp_path, monkeypatch) -> Path:
    """The temporary directory (and so the registry's default folder) under tmp_path."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.delenv("DFLASH_TUNE_RUN_DIR", raising=False)
    monkeypatch.delenv("DFLASH_TUNE_SERVER_LOGS", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    return folder


def test_a_launch_leaves_nothing_in_the_temporary_directory(tmp_path, own_tmp):
    with launched(fake_spec(tmp_path, "ok", "--spawn-child", log_path=None)) as server:
        env = psutil.Process(server.pid).environ()
        assert Path(env["TMPDIR"]).parent.parent == own_tmp  # the launch's own scratch/tmp
        (Path(env["TMPDIR"]) / "rendezvous").write_text("what a killed rank leaves")
        assert not Path(env["TORCHINDUCTOR_CACHE_DIR"]).is_relative_to(own_tmp)
        assert "pid" in server.log_excerpt()
    error = launch_error(fake_spec(tmp_path, "oom", log_path=None))
    assert error.failure is FailureClass.OOM and "out of memory" in error.log_excerpt
    assert list(own_tmp.iterdir()) == []


def test_server_logs_are_kept_where_DFLASH_TUNE_SERVER_LOGS_says(tmp_path, own_tmp,
                                                                 monkeypatch):
    monkeypatch.setenv("DFLASH_TUNE_SERVER_LOGS", str(tmp_path / "logs"))
    with launched(fake_spec(tmp_path, "ok", log_path=None)) as server:
        pass
    assert [p.name for p in (tmp_path / "logs").iterdir()] == [server.log_path.name]
    assert "pid" in server.log_path.read_text() and list(own_tmp.iterdir()) == []
