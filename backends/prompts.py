"""The prompts a measurement sends: a dataset, the target's held-out prompts, or random ids.

One choice for every measuring backend (servers, in-process, the tuner's probes), in this order:
the workload's dataset if it names one; else the prompts a built pair keeps beside its target
(`heldout_prompts.json`), cut or repeated to the input length; else random token ids. Random ids
are what a drafter never saw: they measure speed at a lower acceptance than real text would.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from backends.contract import Workload
from backends.datasets import load_samples

RANDOM_SOURCE = "random token ids"


@dataclass(slots=True, frozen=True)
class PromptSet:
    prompts: list[list[int]] | list[str]
    # Per prompt, what each request asks for; None: the workload's output_len for all.
    output_lens: list[int] | None = None
    source: str = RANDOM_SOURCE  # said in logs and warnings


def random_prompts(count: int, length: int, seed: int = 0) -> list[list[int]]:
    """Token ids in 100..999: inside every real vocabulary, clear of special tokens."""
    rng = random.Random(seed)
    return [[rng.randrange(100, 1000) for _ in range(length)] for _ in range(count)]


def held_out_prompts(target_path: str | Path, length: int) -> list[list[int]] | None:
    """The prompts a built pair keeps beside its target (`heldout_prompts.json`), cut or
    repeated to `length`; None when the target has none."""
    path = _held_out_file(target_path)
    if not path.is_file():
        return None
    return [(p * (length // len(p) + 1))[:length] for p in json.loads(path.read_text())]


def prompt_set(workload: Workload, target_path: str | Path, count: int,
               seed: int = 0) -> PromptSet:
    """What to send for ``workload`` to the target at ``target_path`` (see the module doc);
    ``count`` sizes the random set. Raises ``DatasetError`` for an unreadable dataset."""
    source = prompt_source(workload, target_path)
    if workload.dataset:
        samples = load_samples(workload.dataset, target_path)
        lens = ([s.output_len or workload.output_len for s in samples]
                if workload.dataset_output_lens else None)
        return PromptSet([s.prompt for s in samples], lens, source)
    held_out = held_out_prompts(target_path, workload.input_len)
    if held_out:
        return PromptSet(held_out, source=source)
    return PromptSet(random_prompts(count, workload.input_len, seed))


def prompt_source(workload: Workload, target_path: str | Path) -> str:
    """Which source :func:`prompt_set` would use, without reading it."""
    if workload.dataset:
        return f"dataset {workload.dataset}"
    if _held_out_file(target_path).is_file():
        return f"held-out prompts of {target_path}"
    return RANDOM_SOURCE


def workload_prompts(target_path: str | Path, length: int, count: int,
                     seed: int = 0) -> list[list[int]]:
    """Token-id prompts of ``length``: held-out ones if the target has them, else random."""
    return held_out_prompts(target_path, length) or random_prompts(count, length, seed)


def _held_out_file(target_path: str | Path) -> Path:
    return Path(target_path).parent / "heldout_prompts.json"
