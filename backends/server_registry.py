"""The servers this machine's tuners launched, so that one whose tuner was SIGKILLed is found
and taken down by the next launch.

PR_SET_PDEATHSIG (backends/server.py) kills a server leader with its tuner, but not the workers
it forked (vLLM's EngineCore and Worker processes, SGLang's schedulers): those keep the GPU and
the port. Every launch records its process group with the tuner's pid and a token put in the
server's environment, which its workers inherit; the next launch kills every process that holds
the token of a group whose tuner is gone. The token, not the group id, decides: a reused pid or
group id never leads to killing a process that is not ours. The launch's scratch folder
(backends/server.py) goes with them. The registry's folder exists only while a launch is
recorded in it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import uuid
from pathlib import Path

import psutil

TOKEN_VAR = "DFLASH_TUNE_SERVER_TOKEN"


def registry_dir() -> Path:
    """Per user, under the temporary directory (``DFLASH_TUNE_RUN_DIR`` overrides it)."""
    default = Path(tempfile.gettempdir()) / f"dflash-tune-servers-{os.getuid()}"
    return Path(os.environ.get("DFLASH_TUNE_RUN_DIR") or default)


def new_token() -> str:
    return uuid.uuid4().hex


def record(pgid: int, token: str, scratch: Path) -> None:
    """Written once the server started: its group, its token, its scratch folder and the tuner
    that owns it."""
    owner = psutil.Process()
    entry = {"pgid": pgid, "token": token, "scratch": str(scratch), "owner": owner.pid,
             "owner_started": owner.create_time()}
    for _ in range(3):  # another tuner's `forget` may remove the folder, empty, in between
        registry_dir().mkdir(parents=True, exist_ok=True)
        try:
            (registry_dir() / f"{token}.json").write_text(json.dumps(entry))
            return
        except FileNotFoundError:
            continue
    raise FileNotFoundError(f"cannot keep {registry_dir()}: it keeps disappearing")


def forget(token: str) -> None:
    (registry_dir() / f"{token}.json").unlink(missing_ok=True)
    _remove_if_empty(registry_dir())


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # other launches are recorded in it, or it is gone already
        pass


def reap_stale() -> list[int]:
    """Kill the processes of every recorded server whose tuner is gone; the pids killed."""
    killed: list[int] = []
    for path in sorted(registry_dir().glob("*.json")) if registry_dir().is_dir() else []:
        entry = _read(path)
        if entry is None or _owner_alive(entry):
            continue
        killed += _kill_holders(entry["token"])
        if entry.get("scratch"):
            shutil.rmtree(entry["scratch"], ignore_errors=True)
        path.unlink(missing_ok=True)
    _remove_if_empty(registry_dir())
    return killed


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # half written by a tuner killed mid-write: nothing to trust
        path.unlink(missing_ok=True)
        return None


def _owner_alive(entry: dict) -> bool:
    try:
        owner = psutil.Process(entry["owner"])
        return abs(owner.create_time() - entry["owner_started"]) < 1.0 and owner.is_running()
    except psutil.NoSuchProcess:
        return False


def _kill_holders(token: str) -> list[int]:
    killed = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(TOKEN_VAR) == token:
                proc.send_signal(signal.SIGKILL)
                killed.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return killed
