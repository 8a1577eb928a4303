"""Reading space files: a path, or the bare name of a space shipped in this package."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml

from search_spaces.errors import SpaceError
from search_spaces.unique_yaml import DuplicateKey, UniqueKeyLoader
from search_spaces.schema import space_from_dict
from search_spaces.space import SearchSpace

SHIPPED = Path(__file__).parent


def list_spaces() -> list[str]:
    """Names of the spaces shipped with the package (``load_space(name)`` loads one)."""
    return sorted(p.stem for p in SHIPPED.glob("*.yaml"))


def load_space(
    path_or_name: str | Path, known_params: Collection[str] | None = None
) -> SearchSpace:
    """Load a space from a YAML file, or by bare name from the shipped ones.

    A ``str`` without a path separator and without a ``.yaml``/``.yml`` suffix is a shipped
    name (``"pcie8_kimi"``); anything else is a path. With ``known_params`` (e.g. the
    ``LaunchParams`` field names) a misspelt parameter fails here, not inside a backend.
    """
    path = _resolve(path_or_name)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpaceError(f"{path}: cannot read: {e.strerror}") from None
    return space_from_dict(_parse_yaml(text, path), str(path), known_params)


def _resolve(path_or_name: str | Path) -> Path:
    if isinstance(path_or_name, Path):
        return path_or_name
    if "/" in path_or_name or "\\" in path_or_name or path_or_name.endswith((".yaml", ".yml")):
        return Path(path_or_name)
    path = SHIPPED / f"{path_or_name}.yaml"
    if not path.is_file():
        raise SpaceError(
            f"{path_or_name}: no such shipped space; shipped: {', '.join(list_spaces())}"
        )
    return path


def _parse_yaml(text: str, path: Path) -> Any:
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass
    except DuplicateKey as e:
        raise SpaceError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise SpaceError(f"{path}: invalid YAML: {e}") from None
