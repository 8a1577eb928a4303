"""Acceptance of a built pair on its held-out prompts (greedy), for the manifest and benches."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dflash_core.engine import Engine, EngineConfig
from dflash_core.loader import load_drafter, load_target
from dflash_core.proposer import DFlashProposer
from dflash_core.spec import SamplingParams, Spec

EVAL_TOKENS = 64


def load_pair(directory: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    root = Path(directory)
    target = load_target(root / "target", dtype, device)
    drafter = load_drafter(root / "drafter", target.config, dtype, device)
    return target, drafter


def held_out_prompts(directory: str | Path) -> list[list[int]]:
    return json.loads((Path(directory) / "heldout_prompts.json").read_text())


def pair_engine(target, drafter, prompts: list[list[int]], max_tokens: int,
                max_tree_nodes: int = 65) -> Engine:
    config = EngineConfig(max_batch=len(prompts),
                          max_context=max(map(len, prompts)) + max_tokens + 1,
                          max_tree_nodes=max_tree_nodes)
    return Engine(target, DFlashProposer(drafter, target), config)


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
