"""Qwen3 building blocks: RMSNorm, rotary embedding, SwiGLU MLP and the routed-expert MoE."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dflash_core.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in fp32 as Qwen3 does; bf16 variance loses the small components.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_tables(head_dim: int, theta: float, positions: Tensor) -> tuple[Tensor, Tensor]:
    """cos/sin for explicit positions, so tree siblings can share a position."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device) / head_dim)
    angles = positions.float()[..., None] * inv_freq  # [B, N, D/2]
    angles = torch.cat([angles, angles], dim=-1)  # [B, N, D]
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [B, H, N, D]; cos/sin: [B, N, D] (rotate-half convention of the HF Qwen3 weights)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    return x * cos + rotated * sin


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """Qwen3-MoE sparse block: softmax router, top-k experts, optional renormalised weights."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(
            MLP(cfg.hidden_size, cfg.moe_intermediate_size) for _ in range(cfg.num_experts)
        )

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])  # [T, H]
        weights, experts = self.route(tokens)  # [T, k], [T, k]
        out = torch.zeros_like(tokens)
        # Loop over the experts that were hit: each reads its weights once for all its tokens,
        # which is the memory-traffic behaviour the performance model assumes.
        for expert_id in experts.unique().tolist():
            rows, slot = (experts == expert_id).nonzero(as_tuple=True)
            y = self.experts[expert_id](tokens[rows])  # [t, H]
            out.index_add_(0, rows, y * weights[rows, slot, None])
        return out.reshape(shape)

    def route(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        probs = F.softmax(self.gate(tokens).float(), dim=-1)  # [T, E]
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights.to(tokens.dtype), experts
