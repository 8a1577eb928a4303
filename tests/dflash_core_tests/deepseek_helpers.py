"""Tiny random DeepSeek-V3 / Kimi-shaped targets and their DFlash drafters (odd sizes on
purpose: a mixed-up dimension shows as a shape error, not a coincidence)."""

from __future__ import annotations

import torch
from core_helpers import BLOCK, MASK_TOKEN, VOCAB

from dflash_core import DrafterConfig, ModelConfig, Target
from dflash_core.models.deepseek_config import DeepseekConfig
from dflash_core.models.deepseek_target import deepseek_target
from dflash_core.models.drafter import Drafter
from dflash_core.models.int4 import Int4Scheme
from dflash_core.models.yarn import YarnScaling

HIDDEN = 36
YARN = YarnScaling(factor=4.0, original_max_position_embeddings=32, mscale=1.0,
                   mscale_all_dim=0.7)


def deepseek_config(q_lora: bool = True, yarn: bool = True, int4: bool = False,
                    **overrides) -> DeepseekConfig:
    """3 layers (the first dense), 8 routed experts top-2 in 2 groups (1 kept), 1 shared."""
    fields = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=44,
                  moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=3,
                  kv_lora_rank=14, qk_nope_head_dim=10, qk_rope_head_dim=6, v_head_dim=9,
                  q_lora_rank=20 if q_lora else None, n_routed_experts=8, n_shared_experts=1,
                  num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
                  routed_scaling_factor=2.5, rope_theta=10_000.0,
                  rope_scaling=YARN if yarn else None,
                  quantization=Int4Scheme(group_size=32) if int4 else None)
    return DeepseekConfig(**fields | overrides)


def make_deepseek(seed: int = 0, **options) -> Target:
    torch.manual_seed(seed)
    target = deepseek_target(deepseek_config(**options)).eval()
    with torch.no_grad():
        target.model.embed_tokens.weight.mul_(2.0)  # decisive next-token choices (no near-ties)
        for layer in target.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:  # a bias that changes which experts are chosen
                gate.e_score_correction_bias.normal_(0, 0.2)
                if options.get("int4"):
                    _random_int4(layer.mlp.experts)
    return target


def _random_int4(experts) -> None:
    for name in ("gate_up", "down"):
        packed = getattr(experts, f"{name}_packed")
        packed.copy_(torch.randint(-2**31, 2**31 - 1, packed.shape, dtype=torch.int64))
        getattr(experts, f"{name}_scale").uniform_(0.01, 0.05)


def kimi_drafter(seed: int = 1, block_size: int = BLOCK) -> Drafter:
    """Qwen3-style GQA layers at the target's hidden size with YaRN RoPE, tapping layers 0, 2."""
    torch.manual_seed(seed)
    layers = ModelConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=40,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, rope_theta=10_000.0, rope_scaling=YarnScaling(4.0, 32))
    return Drafter(DrafterConfig(layers, block_size, [0, 2], MASK_TOKEN)).eval()
