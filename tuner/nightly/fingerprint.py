"""What the machine looked like when a nightly run measured: engine, driver, GPU, code and
checkpoint revisions. A slowdown that coincides with one of these changing has its suspect."""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

from backends.flags import DEFAULT_VERSIONS
from tuner.config import Config

REPO = Path(__file__).resolve().parents[2]
# Distribution that installs each engine: its installed version is what an upgrade changes,
# while the config's engine_version only says which flag table to render.
_ENGINE_DISTS = {"sglang": "sglang", "vllm": "vllm", "dflash": "dflash-tune"}
_TIMEOUT_S = 10  # a hung nvidia-smi or git must not hang the nightly job


def collect(cfg: Config) -> dict[str, Any]:
    """The environment fingerprint stored with a nightly run (JSON-ready, flat-ish)."""
    b = cfg.backend
    return {
        "backend": b.name,
        "engine": b.engine,
        "engine_version": b.engine_version or DEFAULT_VERSIONS.get(b.engine),
        "engine_installed": _dist_version(_ENGINE_DISTS.get(b.engine, b.engine)),
        "python": platform.python_version(),
        "torch": _dist_version("torch"),
        **_gpu(),
        "host": socket.gethostname(),
        "model_revision": _revision(cfg.model.path),
        "drafter_revision": _revision(cfg.drafter.path) if cfg.drafter else None,
        "repo_revision": _git_head(REPO),
    }


def changes(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for every entry that differs; nothing when there is no old one."""
    if not old:
        return []
    keys = sorted(set(old) | set(new))
    return [f"{k}: {old.get(k)} -> {new.get(k)}" for k in keys if old.get(k) != new.get(k)]


def _dist_version(name: str) -> str | None:
    # Metadata only: importing torch to ask its version would cost seconds.
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gpu() -> dict[str, str]:
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]) \
        if shutil.which("nvidia-smi") else None
    rows = [[part.strip() for part in line.split(",")] for line in (out or "").splitlines()]
    rows = [r for r in rows if len(r) == 2]
    if not rows:
        return {"gpu": "none", "driver": "none"}
    names = sorted({name for name, _ in rows})
    return {"gpu": f"{len(rows)}x {' + '.join(names)}",
            "driver": ", ".join(sorted({driver for _, driver in rows}))}


def _revision(path: str) -> str | None:
    """The git revision of a checkpoint folder, else a stamp of its files' names, sizes and
    modification times (cheap: a weight update shows without reading gigabytes)."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    head = _git_head(folder)
    if head:
        return head
    try:
        entries = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns)
                         for p in folder.iterdir() if p.is_file())
    except OSError:
        return None
    return "files:" + hashlib.sha1(repr(entries).encode()).hexdigest()[:12]


def _git_head(folder: Path) -> str | None:
    return _run(["git", "-C", str(folder), "rev-parse", "HEAD"])


def _run(argv: list[str]) -> str | None:
    """stdout of a read-only query, or None when it is absent, fails or hangs."""
    try:
        done = subprocess.run(argv, check=False, capture_output=True, text=True,
                              timeout=_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None
