"""Where the tiny pair lives, and building it when it is missing."""

from __future__ import annotations

import os
from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[2] / "fixtures" / "tiny_code"
ENV_VAR = "DFLASH_TUNE_PAIR"
PARTS = ("target/config.json", "target/model.safetensors", "target/tokenizer.json",
         "drafter/config.json", "drafter/model.safetensors", "heldout_prompts.json")


CACHE = Path.home() / ".cache" / "dflash-tune" / "tiny_code"


def default_pair_dir() -> Path:
    """$DFLASH_TUNE_PAIR, else the pair shipped in the repository checkout (`fixtures/tiny_code`),
    else a user cache folder (an install without the checkout builds it there)."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    return SHIPPED if SHIPPED.parent.is_dir() else CACHE


def is_complete(directory: Path) -> bool:
    return all((directory / part).is_file() for part in PARTS)


def ensure_pair(directory: Path | None = None, recipe=None, progress=None) -> Path:
    """The pair at `directory`, built there first (about 3 minutes on 2 cores) if incomplete."""
    directory = Path(directory or default_pair_dir())
    if not is_complete(directory):
        from dflash_core.training.build import build_pair

        build_pair(directory, recipe, progress)
    else:
        # A pair built before the HF fields real engines need: add them, weights untouched.
        from dflash_core.training import hf_layout

        hf_layout.complete(directory)
    return directory
