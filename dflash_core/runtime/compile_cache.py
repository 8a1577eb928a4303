"""Where torch.compile keeps the code Inductor generates: a per-user cache folder that outlives
the process, not the temporary directory (Inductor's default, and torch creates the folder on
its first call, compiling or not), which a launch's cleanup or a reboot empties and the next
launch would then compile into again. Imports no torch."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "TORCHINDUCTOR_CACHE_DIR"


def inductor_cache_dir() -> Path:
    """``$TORCHINDUCTOR_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/dflash-tune/torchinductor``
    (``~/.cache/dflash-tune/torchinductor``)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "dflash-tune" / "torchinductor"


def use_inductor_cache() -> None:
    """Point this process's Inductor (and every process it starts) at
    :func:`inductor_cache_dir`."""
    os.environ[ENV] = str(inductor_cache_dir())
