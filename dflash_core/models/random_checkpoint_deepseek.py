"""A tiny random Kimi-shaped target and a matching DFlash drafter (random_checkpoint writes
them in the HF layouts: `fixtures random --arch deepseek-v3`).

The target is DeepSeek-V3 / Kimi K2 in small: the first layer dense then MoE layers, MLA with
q_lora, YaRN with the mscale correction, one expert group (as Kimi), one shared expert, routed
experts INT4 in the compressed-tensors pack-quantized layout, sharded safetensors with an
index. The drafter is Qwen3-style GQA at the target's hidden size with the same YaRN, tapping
target layers. Random weights: for exercising loading, shapes and the engine, not for quality.
"""

from __future__ import annotations

import torch

from dflash_core.models.config import DrafterConfig, ModelConfig
from dflash_core.models.deepseek_config import DeepseekConfig
from dflash_core.models.deepseek_target import deepseek_target
from dflash_core.models.drafter import Drafter
from dflash_core.models.int4 import Int4Experts, Int4Scheme
from dflash_core.models.layers import Experts
from dflash_core.models.target import Target
from dflash_core.models.yarn import YarnScaling

VOCAB = 512
YARN = YarnScaling(factor=64.0, original_max_position_embeddings=64, mscale=1.0,
                   mscale_all_dim=1.0)  # Kimi K2.6's rule over a tiny original length
TARGET_LAYERS = 4
TAPS = [1, 2]  # Kimi's drafters tap [1, 12, 24, 35, 47, 58] of 61 layers


def kimi_like_config() -> DeepseekConfig:
    # Splits up to --tp 4 --ep 2: 4 heads, 16 experts, and an expert's intermediate of 64 leaves
    # each of moe_tp = 2 ranks 32, one whole INT4 group (tp 4 with ep 1 cannot split it).
    return DeepseekConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
        num_hidden_layers=TARGET_LAYERS, num_attention_heads=4, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, q_lora_rank=48,
        n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=4, n_group=1, topk_group=1,
        first_k_dense_replace=1, routed_scaling_factor=2.827, rms_norm_eps=1e-5,
        rope_theta=50_000.0, rope_scaling=YARN, quantization=Int4Scheme(group_size=32))


def kimi_like_drafter_config(block_size: int = 8) -> DrafterConfig:
    layers = ModelConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, rms_norm_eps=1e-5, rope_theta=50_000.0,
                         rope_scaling=YarnScaling(YARN.factor,
                                                  YARN.original_max_position_embeddings))
    return DrafterConfig(layers, block_size, list(TAPS), mask_token_id=VOCAB - 2)


def deepseek_pair(seed: int = 0) -> tuple[Target, Drafter]:
    """The target (its routed experts INT4 from random float ones) and its drafter."""
    torch.manual_seed(seed)
    target = deepseek_target(kimi_like_config()).eval()
    for layer in target.model.layers:
        if isinstance(getattr(layer.mlp, "experts", None), Int4Experts):
            _quantized_random_experts(layer.mlp.experts)
    return target, Drafter(kimi_like_drafter_config()).eval()


def _quantized_random_experts(experts: Int4Experts) -> None:
    """The INT4 stacks from freshly initialised float experts (realistic scales per group)."""
    floats = Experts(experts.num_experts, experts.hidden, experts.intermediate)
    experts.quantize_from(floats.gate_up_proj.data, floats.down_proj.data)
