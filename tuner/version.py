"""The installed package's version, or the checkout's when it is run without being installed."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

PACKAGE = "dflash-tune"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
# The [project] table's `version = "..."` line (tomllib is 3.11+; we support 3.10).
VERSION_LINE = re.compile(r'^version\s*=\s*"([^"]+)"', re.MULTILINE)


def package_version() -> str:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        found = VERSION_LINE.search(PYPROJECT.read_text())
    except OSError:
        found = None
    return found.group(1) if found else "unknown"
