from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import write_config
from pg_server import postgres


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    return write_config(tmp_path)


@pytest.fixture(scope="module")
def pg():
    with postgres() as server:  # skips without PostgreSQL or psycopg2
        yield server
