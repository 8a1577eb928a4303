"""Random checkpoints in the public layouts: a target and a matching DFlash drafter, for smoke
tests and for trying the engine (`dflash-tune fixtures random`). Tiny, seeded, never trained.

`ARCHS` maps an architecture name to the function that builds its (target, drafter) pair and
how many files the target is written in; a new architecture is one entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from dflash_core.models.config import DrafterConfig, ModelConfig
from dflash_core.models.drafter import Drafter
from dflash_core.models.loader import save_model
from dflash_core.models.random_checkpoint_deepseek import deepseek_pair
from dflash_core.models.target import Target

VOCAB = 512
BLOCK = 4
# Splits evenly up to --tp 4 --ep 2 (4 heads, 2 KV heads, 4 experts): every layout the tests run.
_SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10_000.0)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_TEXT = ("def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n    y: int = 0\n"
         "for i in range(10):\n    print(i, add(i, i))\n")


def qwen3_pair(seed: int, **extra) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    target = Target(ModelConfig(**_SHAPE, **extra)).eval()
    with torch.no_grad():  # larger embeddings: decisive next-token choices, no fp32 near-ties
        target.model.embed_tokens.weight.mul_(2.0)
    layers = ModelConfig(**{**_SHAPE, "num_hidden_layers": 1})
    drafter = Drafter(DrafterConfig(layers, BLOCK, [0, 1], VOCAB - 1)).eval()
    return target, drafter


@dataclass(slots=True, frozen=True)
class RandomArch:
    pair: Callable[[int], tuple[nn.Module, nn.Module]]  # seed -> (target, drafter), untrained
    shards: int = 1  # safetensors files of the target (more than one: with an index)


ARCHS: dict[str, RandomArch] = {
    "qwen3": RandomArch(qwen3_pair),
    "qwen3-moe": RandomArch(lambda seed: qwen3_pair(seed, **_MOE)),
    "deepseek-v3": RandomArch(deepseek_pair, shards=3),  # Kimi K2 shaped, INT4 experts
}


def write_random_pair(arch: str, out: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """-> (target folder, drafter folder) under `out`; the target's has a tokenizer.json."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; known: {', '.join(sorted(ARCHS))}")
    target, drafter = ARCHS[arch].pair(seed)
    out = Path(out)
    save_model(target, out / "target", shards=ARCHS[arch].shards)
    save_model(drafter, out / "drafter")
    _tokenizer(target.config.vocab_size).save(str(out / "target" / "tokenizer.json"))
    return out / "target", out / "drafter"


def _tokenizer(vocab: int):
    from dflash_core.training.tokenizer import train_tokenizer

    return train_tokenizer([_TEXT], vocab)
