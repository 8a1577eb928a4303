"""Acceptance of a built pair on its held-out prompts (greedy), for the manifest and benches."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dflash_core.models.drafter import Drafter
from dflash_core.models.target import Target
from dflash_core.runtime.engine import Engine
from dflash_core.runtime.factory import build_engine, load_models
from dflash_core.speculation.spec import SamplingParams, Spec

EVAL_TOKENS = 64


def load_pair(directory: str | Path, dtype: str | torch.dtype = "float32",
              device: str = "cpu") -> tuple[Target, Drafter]:
    root = Path(directory)
    return load_models(root / "target", root / "drafter", dtype, device)


def held_out_prompts(directory: str | Path) -> list[list[int]]:
    return json.loads((Path(directory) / "heldout_prompts.json").read_text())


def pair_engine(target: Target, drafter: Drafter, prompts: list[list[int]], max_tokens: int,
                max_tree_nodes: int = 65) -> Engine:
    """An engine sized for exactly these prompts and `max_tokens` new tokens each."""
    return build_engine(target, drafter, max_batch=len(prompts),
                        max_context=max(map(len, prompts)) + max_tokens + 1,
                        max_tree_nodes=max_tree_nodes)


def acceptance_report(directory: str | Path, max_tokens: int = EVAL_TOKENS) -> dict[str, float]:
    """Mean acceptance length at the headline settings (block 8 DFlash, DDTree budget 32)."""
    target, drafter = load_pair(directory)
    prompts = held_out_prompts(directory)
    engine = pair_engine(target, drafter, prompts, max_tokens)
    block = drafter.config.block_size
    specs = {f"dflash_b{block}": Spec.dflash(block),
             f"ddtree_b{block}_budget32": Spec.ddtree(block, 32)}
    greedy = SamplingParams(max_tokens=max_tokens)
    return {name: round(engine.generate(prompts, greedy, spec).stats.mean_acceptance, 3)
            for name, spec in specs.items()}
