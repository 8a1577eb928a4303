"""Qwen3 target model (dense and MoE) with a static KV cache and tapped hidden states.

Module names follow the Hugging Face checkpoints (`model.layers.{i}.self_attn.q_proj`, ...), so
a safetensors state dict loads without renaming.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from dflash_core.models.attention import Attention
from dflash_core.models.cache import Cache
from dflash_core.models.config import ModelConfig
from dflash_core.models.kv_cache import KVCache
from dflash_core.models.layers import (MLP, HeadRope, MoE, RMSNorm, cast, head_rope,
                                       rope_tables)
from dflash_core.models.step import Step


class DecoderLayer(nn.Module):
    """Pre-norm attention + MLP with residuals; another architecture passes its own two parts."""

    def __init__(self, cfg: ModelConfig, index: int, self_attn: nn.Module | None = None,
                 mlp: nn.Module | None = None) -> None:
        super().__init__()
        self.index = index
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg) if self_attn is None else self_attn
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if mlp is None:
            moe = cfg.is_moe_layer(index)
            mlp = MoE(cfg) if moe else MLP(cfg.hidden_size, cfg.intermediate_size)
        self.mlp = mlp

    def forward(self, h: Tensor, rope: HeadRope | tuple[Tensor, Tensor], step: Step,
                cache: Cache | None) -> Tensor:
        h = h + self.self_attn(self.input_layernorm(h), rope, step, cache, self.index)
        return h + self.mlp(self.post_attention_layernorm(h))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.config = cfg

    def rope(self, positions: Tensor) -> HeadRope:
        """The tables every layer of one forward rotates with, made once."""
        cfg = self.config
        return head_rope(rope_tables(cfg.head_dim, cfg.rope_theta, positions, cfg.rope_scaling),
                         self.embed_tokens.weight.dtype)

    def allocate_cache(self, batch: int, capacity: int, dtype: torch.dtype,
                       device: torch.device) -> KVCache:
        cfg = self.config
        kv_heads = self.layers[0].self_attn.n_kv  # this rank's, when split over ranks
        return KVCache.allocate(cfg.num_hidden_layers, batch, kv_heads, capacity,
                                cfg.head_dim, dtype, device)


class Target(nn.Module):
    """forward(ids, step, cache, taps) -> (final hidden [B, N, H], features [B, N, n_taps * H]).

    `taps` lists the layers whose *output* feeds the drafter (HF `hidden_states[i + 1]`), in the
    drafter's order. Logits are a separate call so callers project only the rows they need.
    """

    comm = None  # the ranks' collectives when split over them (dflash_core.parallel.shard)

    def __init__(self, cfg: ModelConfig, backbone: nn.Module | None = None) -> None:
        super().__init__()
        self.config = cfg
        # The backbone holds what differs between architectures: its layers, its RoPE tables
        # and the kind of cache its attention keeps.
        self.model = Backbone(cfg) if backbone is None else backbone
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids: Tensor, step: Step, cache: Cache | None = None,
                taps: Sequence[int] = ()) -> tuple[Tensor, Tensor]:
        h = self.model.embed_tokens(ids)  # [B, N, H]
        rope = self.model.rope(step.positions)
        outputs = {}
        for layer in self.model.layers:
            h = layer(h, rope, step, cache)
            if layer.index in taps:
                outputs[layer.index] = h
        # Concatenated in the drafter's listed order: its fc weight was trained on that order.
        features = torch.cat([outputs[i] for i in taps], dim=-1) if taps else h[..., :0]
        return self.model.norm(h), features

    def logits(self, hidden: Tensor) -> Tensor:
        return cast(self.lm_head(hidden), torch.float32)  # [..., V]

    def embed(self, ids: Tensor) -> Tensor:
        return self.model.embed_tokens(ids)

    def allocate_cache(self, batch: int, capacity: int) -> Cache:
        weight = self.lm_head.weight
        return self.model.allocate_cache(batch, capacity, weight.dtype, weight.device)
