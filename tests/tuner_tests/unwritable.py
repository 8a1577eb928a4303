"""A folder the test process cannot write to, as whoever runs the tests (root included)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest


def unwritable_folder(tmp_path: Path) -> Path:
    """A read-only folder: mode 0o555 for a normal user; for root, who ignores file modes,
    /sys (sysfs refuses new files even to root). Skips where neither is unwritable."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    folder = Path("/sys")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return folder
    pytest.skip("no folder here refuses writes to root")
