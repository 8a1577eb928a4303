"""Reading ``tuner.yaml``: safe YAML whose mapping keys must be unique.

PyYAML keeps the last of two equal keys without a word, so a second ``n_trials:`` further down
would silently win; ``search_spaces.unique_yaml`` refuses them, here as in space files.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from search_spaces.unique_yaml import DuplicateKey, UniqueKeyLoader
from tuner.errors import ConfigError

# A tuner.yaml is a page or two; anything larger is the wrong file (a log, a checkpoint), and
# reading it whole would take as long as it is big.
MAX_CONFIG_BYTES = 1 << 20

def read_config_yaml(path: Path) -> dict[str, Any]:
    """The mapping in ``path``; every problem is a :class:`ConfigError` line naming the file."""
    try:
        text = _read_small_file(path)
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


def _read_small_file(path: Path) -> str:
    """The text of ``path``, a regular file of at most MAX_CONFIG_BYTES. Checked on the open
    file, without blocking: a FIFO or a device (/dev/zero) would block or never end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError([f"{path}: not a regular file; point -c at a tuner.yaml"])
        if info.st_size > MAX_CONFIG_BYTES:
            raise ConfigError([f"{path}: {info.st_size:,} bytes is no tuner.yaml (at most "
                               f"{MAX_CONFIG_BYTES:,}); point -c at the right file"])
        data = file.read(MAX_CONFIG_BYTES + 1)
    try:
        return data.decode()
    except UnicodeDecodeError as err:
        raise ConfigError([f"{path}: not UTF-8 text ({err.reason} at byte {err.start})"]) \
            from err
