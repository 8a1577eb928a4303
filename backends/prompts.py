"""The fixed prompt sets a measurement sends: random token ids, or a target's held-out prompts."""

from __future__ import annotations

import json
import random
from pathlib import Path


def random_prompts(count: int, length: int, seed: int = 0) -> list[list[int]]:
    """Token ids in 100..999: inside every real vocabulary, clear of special tokens."""
    rng = random.Random(seed)
    return [[rng.randrange(100, 1000) for _ in range(length)] for _ in range(count)]


def held_out_prompts(target_path: str | Path, length: int) -> list[list[int]] | None:
    """The prompts a built pair keeps beside its target (`heldout_prompts.json`), cut or
    repeated to `length`; None when the target has none."""
    path = Path(target_path).parent / "heldout_prompts.json"
    if not path.is_file():
        return None
    return [(p * (length // len(p) + 1))[:length] for p in json.loads(path.read_text())]


def workload_prompts(target_path: str | Path, length: int, count: int,
                     seed: int = 0) -> list[list[int]]:
    return held_out_prompts(target_path, length) or random_prompts(count, length, seed)
