"""Safe YAML whose mapping keys must be unique, for space files and ``tuner.yaml`` alike.

Imports nothing but PyYAML, so the tuner's config reader can use it without loading Optuna.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import yaml

MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKey(yaml.YAMLError):
    """Its message is the ``field.path: duplicate key (line N)`` line."""


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice (PyYAML keeps the last one silently) with a
    ``field.path: duplicate key`` line."""

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
                raise DuplicateKey(f"{where}: duplicate key (line {key_node.start_mark.line + 1})")
            keys.add(key)
            self._check(value, path if key is None else (*path, str(key)), seen)
