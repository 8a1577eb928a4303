from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import write_config


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    return write_config(tmp_path)
