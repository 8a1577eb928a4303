"""Launch a serving process, wait until it is healthy, and always take it down again.

Used by the real backends (SGLang, vLLM, ``dflash-tune serve``)::

    with launched(ServerSpec(argv=flags, port=free_port())) as server:
        run_load(server.base_url)
        server.check()   # raises ServerError if the server died while measured

The server runs in its own process group, so teardown signals the server *and* every worker it
started; nothing is left behind after success, an exception or Ctrl-C. On Linux the server is
also killed when the thread that launched it dies (PR_SET_PDEATHSIG), so a SIGKILLed tuner
leaves no server behind; that covers the server process itself, not workers it forked: those
carry the launch's token (`backends.server_registry`), and the next launch kills them.

Each launch has a scratch folder of its own that goes with it: the server's log (kept only where
``log_path`` or ``DFLASH_TUNE_SERVER_LOGS`` says; a failure's excerpt is read while the server is
up) and the server's TMPDIR, so what a killed server or its workers leave in their temporary
directory (rank rendezvous folders, multiprocessing's sockets) goes too.

A failure to come up is a :class:`ServerError` whose :class:`~backends.contract.FailureClass`
comes from :func:`classify`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from backends import server_registry
from backends.contract import FailureClass
from backends.failure_log import classify
from dflash_core.runtime.compile_cache import inductor_cache_dir

EXCERPT_CHARS = 4000
_CLASSIFY_BYTES = 64 * 1024  # the final traceback is at the end; decode logs can be huge
_POLL_S = 0.1
_KILL_WAIT_S = 5.0  # SIGKILL cannot be ignored; this only waits for the kernel
_log = logging.getLogger(__name__)
LOGS_VAR = "DFLASH_TUNE_SERVER_LOGS"  # a folder that keeps every launch's log


@dataclass(slots=True)
class ServerSpec:
    """How to start one server and how to tell that it is up."""

    argv: list[str]
    port: int
    host: str = "127.0.0.1"
    env: dict[str, str] = field(default_factory=dict)  # added to os.environ
    health_paths: tuple[str, ...] = ("/health", "/v1/models")  # first to answer 200 wins
    start_timeout_s: float = 600.0
    stop_timeout_s: float = 10.0  # SIGTERM grace before SIGKILL
    log_path: Path | None = None  # kept; None: $DFLASH_TUNE_SERVER_LOGS, else removed at the end
    # False for launchers whose server listens outside the group (e.g. `docker run`).
    verify_owner: bool = True


class ServerError(Exception):
    """The server could not start, or died; ``failure`` says why, ``log_excerpt`` shows it."""

    def __init__(self, failure: FailureClass, log_excerpt: str, message: str = "") -> None:
        super().__init__(f"{failure.value}: {message}" if message else failure.value)
        self.failure = failure
        self.log_excerpt = log_excerpt


# --- ports and process groups ---------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody is bound to right now (the kernel's pick; racy by nature, fine for tests)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_taken(host: str, port: int) -> bool:
    """Whether binding ``host:port`` fails, i.e. someone holds it."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR too, so TIME_WAIT leftovers of our last server don't count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is still in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg also succeeds for zombies, which PID 1 of some containers never reaps.
    return any(_is_live(proc) for proc in _group_members(pgid))


def _is_live(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _group_listens(pgid: int, port: int) -> bool:
    for proc in _group_members(pgid):
        try:
            conns = proc.net_connections(kind="inet")
        except psutil.Error:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns):
            return True
    return False


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


# --- the running server ---------------------------------------------------------------------


@dataclass(slots=True)
class RunningServer:
    """A healthy server inside :func:`launched`. Its pid is also its process group id."""

    base_url: str
    pid: int
    pgid: int
    log_path: Path
    spec: ServerSpec
    _proc: subprocess.Popen = field(repr=False)

    def exit_code(self) -> int | None:
        """The leader's exit status (negative: killed by that signal), None while it runs."""
        return _peek_exit(self._proc)

    def alive(self) -> bool:
        return self.exit_code() is None

    def log_excerpt(self, n_chars: int = EXCERPT_CHARS) -> str:
        return _tail(self.log_path, n_chars * 4)[-n_chars:]

    def check(self) -> None:
        """Raise a classified :class:`ServerError` if the server has died."""
        code = self.exit_code()
        if code is not None:
            raise _died(self, code)


def _peek_exit(proc: subprocess.Popen) -> int | None:
    # WNOWAIT leaves the child unreaped: while it is a zombie its pid, and so our pgid, cannot
    # be reused, which keeps the group kill at teardown from hitting a stranger.
    if proc.returncode is not None:
        return proc.returncode
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already
        return proc.poll()
    if info is None or info.si_pid == 0:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _died(server: RunningServer, code: int) -> ServerError:
    failure = classify(code, _tail(server.log_path, _CLASSIFY_BYTES))
    return ServerError(failure, server.log_excerpt(), f"server exited with status {code}")


def _tail(path: Path, n_bytes: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - n_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


# --- lifecycle ------------------------------------------------------------------------------


@contextmanager
def launched(spec: ServerSpec) -> Iterator[RunningServer]:
    """Start ``spec``, yield it once a health path answers 200, and stop its whole process group
    on the way out, whatever happens. Raises :class:`ServerError` if it does not come up: the
    port is taken (before or during start), it exits (classified), or ``start_timeout_s`` ends."""
    stale = server_registry.reap_stale()  # servers of tuners that were killed
    if stale:
        _log.warning("killed %d processes of servers whose tuner is gone: %s", len(stale), stale)
    if port_taken(spec.host, spec.port):
        message = f"{spec.host}:{spec.port} is already bound by another process"
        raise ServerError(FailureClass.PORT_IN_USE, message, message)
    token = server_registry.new_token()
    scratch = Path(tempfile.mkdtemp(prefix="dflash-launch-"))
    try:
        server = _start(spec, token, scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    try:
        server_registry.record(server.pgid, token, scratch)
        _wait_healthy(server)
        yield server
    finally:
        _stop(server._proc, spec.stop_timeout_s)
        shutil.rmtree(scratch, ignore_errors=True)
        server_registry.forget(token)


def _start(spec: ServerSpec, token: str, scratch: Path) -> RunningServer:
    log_path = spec.log_path or _kept_log(spec.port) or scratch / "server.log"
    (scratch / "tmp").mkdir()
    # Unbuffered so the log holds the last lines before a crash. Inductor's cache would follow
    # TMPDIR into the scratch folder and be compiled again every launch: it gets its own place.
    # The token marks the server and every worker it forks as ours (server_registry).
    env = {"PYTHONUNBUFFERED": "1", "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache_dir()),
           **os.environ, "TMPDIR": str(scratch / "tmp"), **spec.env,
           server_registry.TOKEN_VAR: token}
    # Truncate: a previous run's traceback in a reused log must not classify this one.
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(spec.argv, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    preexec_fn=_die_with_parent())  # noqa: PLW1509
        except OSError as exc:
            message = f"cannot start {spec.argv[:1]}"
            raise ServerError(FailureClass.CRASH, str(exc), message) from exc
    host = f"[{spec.host}]" if ":" in spec.host else spec.host
    return RunningServer(f"http://{host}:{spec.port}", proc.pid, proc.pid, log_path, spec, proc)


def _kept_log(port: int) -> Path | None:
    """A new log file in ``$DFLASH_TUNE_SERVER_LOGS`` (None when it is not set), named by the
    time and port of the launch (and a suffix, so a relaunch within the second is kept too)."""
    folder = os.environ.get(LOGS_VAR)
    if not folder:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    fd, path = tempfile.mkstemp(prefix=f"server-{stamp}-{port}-", suffix=".log", dir=folder)
    os.close(fd)
    return Path(path)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that has the kernel SIGKILL the child when its parent (the launching
    thread) dies; None where there is no prctl. libc is resolved here, in the parent, so the
    child between fork and exec only makes the call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != parent:  # the parent died before the call: nobody would signal us
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def _wait_healthy(server: RunningServer) -> None:
    spec = server.spec
    deadline = time.monotonic() + spec.start_timeout_s
    # trust_env=False: an HTTP(S)_PROXY from the environment must not swallow localhost.
    with httpx.Client(timeout=httpx.Timeout(2.0, connect=1.0), trust_env=False) as client:
        while time.monotonic() < deadline:
            server.check()
            if _answers(client, server.base_url, spec.health_paths):
                _check_owner(server)
                return
            time.sleep(_POLL_S)
    server.check()  # died right at the deadline: report why, not that it was slow
    raise ServerError(FailureClass.TIMEOUT, server.log_excerpt(),
                      f"not healthy after {spec.start_timeout_s:g} s")


def _answers(client: httpx.Client, base_url: str, paths: tuple[str, ...]) -> bool:
    for path in paths:
        try:
            if client.get(base_url + path).status_code == 200:
                return True
        except httpx.HTTPError:
            continue
    return False


def _check_owner(server: RunningServer) -> None:
    """A 200 from a process outside our group (a stale or foreign server) is not our server."""
    if server.spec.verify_owner and not _group_listens(server.pgid, server.spec.port):
        raise ServerError(FailureClass.PORT_IN_USE, server.log_excerpt(),
                          f"port {server.spec.port} is served by a process outside the group")


def _stop(proc: subprocess.Popen, stop_timeout_s: float) -> None:
    """SIGTERM the group, SIGKILL what is left after ``stop_timeout_s``, then reap the leader."""
    pgid = proc.pid
    _killpg(pgid, signal.SIGTERM)
    try:
        graceful = _wait_group_gone(proc, stop_timeout_s)
    except BaseException:  # a second Ctrl-C during the grace period: no grace, still no orphans
        _killpg(pgid, signal.SIGKILL)
        _reap(proc)
        raise
    if not graceful:
        _killpg(pgid, signal.SIGKILL)
        _wait_group_gone(proc, _KILL_WAIT_S)
    _reap(proc)


def _reap(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=_KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        # Stuck in the kernel (a wedged GPU driver): hanging the whole study would help no one.
        _log.warning("server pid %d survived SIGKILL; not waiting for it", proc.pid)


def _wait_group_gone(proc: subprocess.Popen, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _peek_exit(proc) is not None and not group_alive(proc.pid):
            return True
        time.sleep(_POLL_S / 2)
    return False


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # already gone
