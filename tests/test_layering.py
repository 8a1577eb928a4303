"""The dependency direction the design fixes: tuner -> backends, search_spaces; backends ->
dflash_core; dflash_core imports none of them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "dflash_core": {"tuner", "backends", "search_spaces"},
    "backends": {"tuner", "search_spaces"},
    "search_spaces": {"tuner", "dflash_core"},
}


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_downstream(package):
    offenders = {
        str(path.relative_to(REPO)): sorted(_imported_top_levels(path) & FORBIDDEN[package])
        for path in (REPO / package).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_packages_resolve_to_this_checkout():
    """Generic names like `tuner` could shadow another installed distribution."""
    import backends
    import search_spaces
    import tuner

    for module in (tuner, backends, search_spaces):
        assert Path(module.__file__).resolve().is_relative_to(REPO)
