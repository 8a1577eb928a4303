"""The dependency direction the design fixes: tuner -> backends, search_spaces; backends ->
dflash_core; dflash_core imports none of them. The tuner reaches the engine only through
backends (so one factory and one LaunchParams -> Spec mapping serve every path), and no module
imports another that imports it back, at any depth, even inside a function."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("tuner", "backends", "search_spaces", "dflash_core")
FORBIDDEN = {
    "dflash_core": {"tuner", "backends", "search_spaces"},
    "backends": {"tuner", "search_spaces"},
    "search_spaces": {"tuner", "dflash_core", "backends"},
    "tuner": {"dflash_core"},
}
# A backend that starts the tuner as a process (`python -m tuner ...`) climbs back into it too.
LAUNCHES_TUNER = re.compile(r"""["']-m["']\s*,\s*["']tuner\b""")


def _imports(path: Path) -> set[str]:
    """Every module this file imports, anywhere in it (dotted names, absolute imports)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_downstream(package):
    offenders = {
        str(path.relative_to(REPO)): sorted({n.split(".")[0] for n in _imports(path)}
                                            & FORBIDDEN[package])
        for path in (REPO / package).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_backend_launches_the_tuner():
    offenders = [str(p.relative_to(REPO)) for p in (REPO / "backends").rglob("*.py")
                 if LAUNCHES_TUNER.search(p.read_text())]
    assert offenders == []


def test_the_launch_pattern_sees_a_launch_of_the_tuner():
    assert LAUNCHES_TUNER.search('[sys.executable, "-m", "tuner", "serve"]')
    assert not LAUNCHES_TUNER.search('[sys.executable, "-m", "backends.dflash_server"]')


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {m for m in _imports(path) if m in modules and m != name}
            for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _without_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's __init__ re-exports its modules, which import siblings through it: that
    is not a circle between concepts, so __init__ modules are left out."""
    packages = {name for name, path in _modules().items() if path.name == "__init__.py"}
    return {v: ws - packages for v, ws in graph.items() if v not in packages}


def test_no_module_imports_one_that_imports_it_back():
    assert _cycles(_without_packages(_graph())) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_packages_resolve_to_this_checkout():
    """Generic names like `tuner` could shadow another installed distribution."""
    import backends
    import search_spaces
    import tuner

    for module in (tuner, backends, search_spaces):
        assert Path(module.__file__).resolve().is_relative_to(REPO)
