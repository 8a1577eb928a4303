"""DFlash block-diffusion drafter.

A few Qwen3-style layers with no embedding or LM head of their own (the target's are used).
Target hidden states of the tapped layers are fused by `fc` + `hidden_norm` into one context
vector per committed position; every draft layer projects those into K/V ("KV injection") that
live in the drafter's own cache, which therefore holds committed context only. The block
[anchor, MASK, ..., MASK] attends to that context and to itself with no mask (non-causal), and
one forward predicts the tokens at positions start+1 .. start+bs-1 (slot j predicts start + j).
"""

from __future__ import annotations

from torch import Tensor, nn

from dflash_core.models.attention import Attention, attend
from dflash_core.models.config import DrafterConfig
from dflash_core.models.kv_cache import KVCache
from dflash_core.models.layers import MLP, HeadRope, RMSNorm, head_rope, rope_tables
from dflash_core.models.step import Step


class DraftLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, index: int) -> None:
        super().__init__()
        lc = cfg.layers
        self.index = index
        self.input_layernorm = RMSNorm(lc.hidden_size, lc.rms_norm_eps)
        self.self_attn = Attention(lc)
        self.post_attention_layernorm = RMSNorm(lc.hidden_size, lc.rms_norm_eps)
        self.mlp = MLP(lc.hidden_size, lc.intermediate_size)

    def write_context(self, ctx: Tensor, rope: HeadRope, slots: Tensor,
                      cache: KVCache) -> None:
        """ctx: [B, C, H] fused context; it skips the layer norm, Q, O and the MLP."""
        k, v = self.self_attn.project_kv(ctx, rope)  # [B, Hkv, C, D]
        cache.write(self.index, slots, k, v)

    def forward(self, h: Tensor, rope: HeadRope, step: Step, cache: KVCache) -> Tensor:
        attn = self.self_attn
        x = self.input_layernorm(h)
        # q [B, Hq, bs, D]; the block's k, v are transient: never written to the cache
        q, k, v = attn.project_qkv(x, rope)
        out = attend(q, cache.prefix(self.index, step.read_len), step.prefix_lens, k, v,
                     step.mask, step.fused, biases=step.biases)
        h = h + attn.project_out(out)
        return h + self.mlp(self.post_attention_layernorm(h))


class Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        lc = cfg.layers
        self.config = cfg
        n_taps = len(cfg.target_layer_ids)
        self.fc = nn.Linear(n_taps * lc.hidden_size, lc.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(lc.hidden_size, lc.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg, i) for i in range(lc.num_hidden_layers))
        self.norm = RMSNorm(lc.hidden_size, lc.rms_norm_eps)

    def write_context(self, features: Tensor, positions: Tensor, cache: KVCache) -> None:
        """features: [B, C, n_taps * H] of newly committed positions [B, C] (also their slots)."""
        ctx = self.hidden_norm(self.fc(features))  # [B, C, H]
        rope = self._rope(positions)
        for layer in self.layers:
            layer.write_context(ctx, rope, positions, cache)

    def forward(self, block: Tensor, step: Step, cache: KVCache) -> Tensor:
        """block: [B, bs, H] embeddings of [anchor, MASK...] -> normed hidden [B, bs, H]."""
        rope = self._rope(step.positions)
        h = block
        for layer in self.layers:
            h = layer(h, rope, step, cache)
        return self.norm(h)

    def allocate_cache(self, batch: int, capacity: int) -> KVCache:
        lc, weight = self.config.layers, self.fc.weight
        return KVCache.allocate(lc.num_hidden_layers, batch, lc.num_key_value_heads, capacity,
                                lc.head_dim, weight.dtype, weight.device)

    def _rope(self, positions: Tensor) -> HeadRope:
        lc = self.config.layers
        return head_rope(rope_tables(lc.head_dim, lc.rope_theta, positions, lc.rope_scaling),
                         self.fc.weight.dtype)
