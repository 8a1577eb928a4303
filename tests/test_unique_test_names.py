"""Test folders have no __init__.py, so two test files with one basename break collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def test_test_file_basenames_are_unique():
    names = Counter(p.name for p in Path(__file__).parent.rglob("*.py") if p.name != "conftest.py")
    assert [name for name, n in names.items() if n > 1] == []
