"""Tiny random fp32 models and engines for the dflash_core tests (built here, never downloaded)."""

from __future__ import annotations

import torch

from dflash_core import (
    DFlashProposer,
    Drafter,
    DrafterConfig,
    Engine,
    EngineConfig,
    ModelConfig,
    Target,
)

VOCAB = 48
MASK_TOKEN = VOCAB - 1
BLOCK = 6


def target_config(moe: bool = False, **overrides) -> ModelConfig:
    fields = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=10_000.0)
    if moe:
        fields.update(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16,
                      mlp_only_layers=[0])
    fields.update(overrides)
    return ModelConfig(**fields)


def drafter_config(block_size: int = BLOCK, **overrides) -> DrafterConfig:
    layers = ModelConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, rope_theta=10_000.0, **overrides)
    return DrafterConfig(layers, block_size, [0, 2], MASK_TOKEN)


def make_target(moe: bool = False, seed: int = 0, **overrides) -> Target:
    torch.manual_seed(seed)
    target = Target(target_config(moe, **overrides)).eval()
    # Larger embeddings make the tiny model's next-token choices decisive (no fp32 near-ties).
    with torch.no_grad():
        target.model.embed_tokens.weight.mul_(2.0)
    return target


def make_drafter(seed: int = 1, block_size: int = BLOCK) -> Drafter:
    torch.manual_seed(seed)
    return Drafter(drafter_config(block_size)).eval()


def make_engine(target: Target, proposer=None, batch: int = 4, nodes: int = 64) -> Engine:
    return Engine(target, proposer, EngineConfig(max_batch=batch, max_context=160,
                                                 max_tree_nodes=nodes))


def dflash_engine(moe: bool = False, batch: int = 4) -> Engine:
    target = make_target(moe)
    return make_engine(target, DFlashProposer(make_drafter(), target), batch)


PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19], [3]]
