"""The DeepSeek-V3 / Kimi K2 backbone inside the common `Target` (embedding, taps, LM head).

Layers 0 .. first_k_dense_replace - 1 have a dense SwiGLU MLP, the rest the DeepSeek MoE; all
use MLA and cache latents (`LatentCache`). Module names follow the HF checkpoints.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dflash_core.models.deepseek_config import DeepseekConfig
from dflash_core.models.deepseek_moe import DeepseekMoE
from dflash_core.models.latent_cache import LatentCache
from dflash_core.models.layers import MLP, RMSNorm, rope_tables
from dflash_core.models.mla import MLAttention
from dflash_core.models.target import DecoderLayer, Target


class DeepseekBackbone(nn.Module):
    def __init__(self, cfg: DeepseekConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(_layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        cfg = self.config
        return rope_tables(cfg.qk_rope_head_dim, cfg.rope_theta, positions, cfg.rope_scaling)

    def allocate_cache(self, batch: int, capacity: int, dtype: torch.dtype,
                       device: torch.device) -> LatentCache:
        cfg = self.config
        return LatentCache.allocate(cfg.num_hidden_layers, batch, capacity,
                                    cfg.kv_lora_rank + cfg.qk_rope_head_dim, dtype, device)


def _layer(cfg: DeepseekConfig, index: int) -> DecoderLayer:
    mlp = DeepseekMoE(cfg) if cfg.is_moe_layer(index) else MLP(cfg.hidden_size,
                                                               cfg.intermediate_size)
    return DecoderLayer(cfg, index, MLAttention(cfg), mlp)


def deepseek_target(cfg: DeepseekConfig) -> Target:
    return Target(cfg, DeepseekBackbone(cfg))
