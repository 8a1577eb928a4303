"""Reading ``tuner.yaml``: safe YAML whose mapping keys must be unique.

PyYAML keeps the last of two equal keys without a word, so a second ``n_trials:`` further down
would silently win. ``search_spaces.loader.UniqueKeyLoader`` refuses them in space files the
same way; it is not reused here because importing ``search_spaces`` imports Optuna, which
``best`` must not pay for.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import ConfigError

MERGE_TAG = "tag:yaml.org,2002:merge"


class _DuplicateKey(yaml.YAMLError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that raises a ``field.path: duplicate key`` line for a key given twice."""

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        self._check(node, (), set())
        return self.construct_document(node)

    def _check(self, node: yaml.Node, path: tuple[str, ...], seen: set[int]) -> None:
        if id(node) in seen:  # an alias: checked where its anchor is
            return
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._check(item, (*path, str(i)), seen)
        if not isinstance(node, yaml.MappingNode):
            return
        keys: set[Hashable] = set()
        for key_node, value in node.value:
            # Plain keys by value (`on` and `true` are one key); merge and complex keys are
            # checked by construction itself.
            plain = isinstance(key_node, yaml.ScalarNode) and key_node.tag != MERGE_TAG
            key = self.construct_object(key_node) if plain else None
            if key is not None and key in keys:
                where = ".".join((*path, str(key)))
                raise _DuplicateKey(f"{where}: duplicate key (line {key_node.start_mark.line + 1})")
            keys.add(key)
            self._check(value, path if key is None else (*path, str(key)), seen)


def read_config_yaml(path: Path) -> dict[str, Any]:
    """The mapping in ``path``; every problem is a :class:`ConfigError` line naming the file."""
    try:
        text = path.read_text()
    except FileNotFoundError as err:
        raise ConfigError([f"{path}: no such config file"]) from err
    except OSError as err:
        raise ConfigError([f"{path}: cannot read ({err.strerror})"]) from err
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except _DuplicateKey as err:
        raise ConfigError([f"{path}: {err}"]) from err
    except yaml.YAMLError as err:
        raise ConfigError([f"{path}: not valid YAML ({err})".replace("\n", " ")]) from err
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError([f"{path}: the top level must be a mapping of sections"])
    return raw
