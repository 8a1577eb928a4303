"""Reading ``tuner.yaml``: safe YAML whose mapping keys must be unique.

PyYAML keeps the last of two equal keys without a word, so a second ``n_trials:`` further down
would silently win; ``search_spaces.unique_yaml`` refuses them, here as in space files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from search_spaces.unique_yaml import DuplicateKey, UniqueKeyLoader
from tuner.errors import ConfigError

def read_config_yaml(path: Path) -> dict[str, Any]:
    """The mapping in ``path``; every problem is a :class:`ConfigError` line naming the file."""
    try:
        text = path.read_text()
    except FileNotFoundError as err:
        raise ConfigError([f"{path}: no such config file"]) from err
    except OSError as err:
        raise ConfigError([f"{path}: cannot read ({err.strerror})"]) from err
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass
    except DuplicateKey as err:
        raise ConfigError([f"{path}: {err}"]) from err
    except yaml.YAMLError as err:
        raise ConfigError([f"{path}: not valid YAML ({err})".replace("\n", " ")]) from err
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError([f"{path}: the top level must be a mapping of sections"])
    return raw
