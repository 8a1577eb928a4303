"""A config file in a temp folder, and the real CLI as a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml


# The workload section of a study without the SLA's default TTFT bounds.
UNBOUNDED_TTFT = {"ttft_p50_ms": None, "ttft_p99_ms": None}


def write_config(folder: Path, **sections: dict[str, Any]) -> Path:
    """A tuner.yaml with a temp SQLite DB; ``sections`` are merged over the defaults."""
    raw: dict[str, Any] = {"study": {"storage": f"sqlite:///{folder / 'results.db'}",
                                     "n_trials": 20}}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values) if isinstance(values, dict) else raw.update(
            {name: values})
    path = folder / "tuner.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
