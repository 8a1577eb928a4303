"""Multi-head latent attention (DeepSeek-V3 / Kimi K2) in the absorbed form.

Each token caches c = norm(kv_a(x)) [R] and one rotary key k_r [Dr] shared by all heads. Head h
would expand them to k_h = [W_uk_h c, k_r] and v_h = W_uv_h c; instead its query is projected
into the latent space (q_nope_h W_uk_h, [R]) and concatenated with its rotary query, so the
scores are q_h . [c, k_r] for every head against the one cached vector, and the output
W_uv_h (sum p c) is projected out after attention. The prefix is thus read by one grouped
matmul for all heads and tree nodes (`attention.attend` with one K/V head), through the same
prefix / tree / log-sum-exp split the Qwen3 path uses; no per-head K/V is ever built.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dflash_core.models.attention import attend
from dflash_core.models.deepseek_config import DeepseekConfig
from dflash_core.models.latent_cache import LatentCache
from dflash_core.models.layers import RMSNorm, apply_rope
from dflash_core.models.step import Step


class MLAttention(nn.Module):
    """Module names are the checkpoints' (`q_a_proj`, `kv_a_proj_with_mqa`, `kv_b_proj`, ...)."""

    def __init__(self, cfg: DeepseekConfig) -> None:
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.nope, self.rope_dim, self.v_dim = (
            cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim)
        self.rank, self.interleaved, self.scale = (
            cfg.kv_lora_rank, cfg.rope_interleave, cfg.softmax_scale)
        q_out = self.heads * (self.nope + self.rope_dim)
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(cfg.hidden_size, q_out, bias=False)
        else:
            self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, q_out, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, self.rank + self.rope_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(self.rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(self.rank, self.heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.heads * self.v_dim, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], step: Step,
                cache: LatentCache | None, layer: int) -> Tensor:
        """x: [B, N, H] -> [B, N, H]. Writes the new latents after reading the prefix (as the
        Qwen3 attention does); with no cache the new tokens attend only to each other."""
        q = self.absorbed_query(x, rope)  # [B, Hq, N, R + Dr]
        latent = self.latent(x, rope)  # [B, 1, N, R + Dr]
        cached = cache.prefix(layer, step.read_len) if cache is not None else None
        # Keys and values are one tensor: the output's rotary columns are dropped below.
        prefix = None if cached is None else (cached, cached)
        out = attend(q, prefix, step.prefix_lens, latent, latent, step.mask, step.fused,
                     self.scale, step.biases)  # [B, Hq, N, R + Dr]
        if cache is not None:
            cache.write(layer, step.slots, latent)
        out = out[..., : self.rank] @ self._w_uv().mT  # [B, Hq, N, Dv]
        return self.o_proj(out.transpose(1, 2).flatten(2))

    def absorbed_query(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        """[B, N, H] -> [B, Hq, N, R + Dr]: the no-rope query in latent space, then the rotary."""
        if hasattr(self, "q_proj"):
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # [B, Hq, N, Dn + Dr]
        q_nope, q_rot = q.split([self.nope, self.rope_dim], dim=-1)
        q_latent = q_nope @ self._w_uk()  # [B, Hq, N, Dn] @ [Hq, Dn, R] -> [B, Hq, N, R]
        return torch.cat([q_latent, self._rotate(q_rot, rope)], dim=-1)

    def latent(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        """[B, N, H] -> [B, 1, N, R + Dr]: what each token caches (normed latent, rotary key)."""
        c, k_rot = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope_dim], dim=-1)
        return torch.cat([self.kv_a_layernorm(c)[:, None], self._rotate(k_rot[:, None], rope)], -1)

    def _rotate(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        if self.interleaved:
            # Pairs (x0, x1), (x2, x3), ... share a frequency: reorder them to the rotate-half
            # layout. Queries and keys are reordered alike, so their dot products are unchanged.
            x = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
        return apply_rope(x, *rope)

    def _kv_b(self) -> Tensor:
        return self.kv_b_proj.weight.view(self.heads, self.nope + self.v_dim, self.rank)

    def _w_uk(self) -> Tensor:
        return self._kv_b()[:, : self.nope]  # [Hq, Dn, R]

    def _w_uv(self) -> Tensor:
        return self._kv_b()[:, self.nope :]  # [Hq, Dv, R]
