from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from search_spaces import SearchSpace
from search_spaces import load_space

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def space_file(tmp_path: Path) -> Callable[[str], Path]:
    """Write a YAML space (dedented) and return its path."""

    def write(text: str) -> Path:
        path = tmp_path / "space.yaml"
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture
def make_space(space_file: Callable[[str], Path]) -> Callable[..., SearchSpace]:
    """Load a space from YAML text."""

    def make(text: str, **kwargs: object) -> SearchSpace:
        return load_space(space_file(text), **kwargs)

    return make
