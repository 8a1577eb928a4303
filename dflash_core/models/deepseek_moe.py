"""DeepSeek-V3 MoE: sigmoid router with a selection bias, group-limited top-k, shared experts.

Routing (``scoring_func`` sigmoid, ``topk_method`` noaux_tc): scores s = sigmoid(x W^T) in fp32;
experts are *chosen* on s + e_score_correction_bias, first keeping the `topk_group` groups whose
best two biased scores sum highest, then the top k experts inside them; the chosen experts are
*weighted* by their unbiased s, renormalised if norm_topk_prob, times routed_scaling_factor.
The shared experts (one MLP of n_shared_experts x moe_intermediate_size) see every token.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dflash_core.models.deepseek_config import DeepseekConfig
from dflash_core.models.int4 import Int4Experts
from dflash_core.models.layers import MLP, Experts


class Router(nn.Module):
    """Checkpoint names: `mlp.gate.weight` [E, H], `mlp.gate.e_score_correction_bias` [E].

    Both are kept in fp32 whatever the model's dtype (as transformers keeps them): the bias
    decides near-ties between experts, and bf16 would round it."""

    def __init__(self, cfg: DeepseekConfig) -> None:
        super().__init__()
        self.top_k, self.groups, self.top_groups = (
            cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group)
        self.norm_topk_prob, self.scaling = cfg.norm_topk_prob, cfg.routed_scaling_factor
        fp32 = torch.float32
        self.weight = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.hidden_size, dtype=fp32))
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)
        self.register_buffer("e_score_correction_bias",
                             torch.zeros(cfg.n_routed_experts, dtype=fp32))

    def forward(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """tokens [T, H] -> (weights [T, k] in the tokens' dtype, expert ids [T, k])."""
        scores = (tokens.float() @ self.weight.float().T).sigmoid()  # [T, E] fp32
        biased = scores + self.e_score_correction_bias.float()
        grouped = biased.unflatten(-1, (self.groups, -1))  # [T, G, E/G]
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)  # [T, G]
        kept = group_scores.topk(self.top_groups, dim=-1).indices  # [T, topk_group]
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
        allowed = group_mask[..., None].expand_as(grouped).flatten(1)  # [T, E]
        experts = biased.masked_fill(~allowed, float("-inf")).topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, experts)  # [T, k]
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return (weights * self.scaling).to(tokens.dtype), experts


class DeepseekMoE(nn.Module):
    def __init__(self, cfg: DeepseekConfig) -> None:
        super().__init__()
        self.gate = Router(cfg)
        shape = (cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        quant = cfg.quantization
        self.experts = Experts(*shape) if quant is None else Int4Experts(*shape, quant.group_size)
        self.shared_experts = MLP(cfg.hidden_size, cfg.shared_intermediate_size) \
            if cfg.n_shared_experts else None

    def forward(self, x: Tensor) -> Tensor:
        tokens = x.reshape(-1, x.shape[-1])  # [T, H]
        out = self.experts(tokens, *self.gate(tokens))  # [T, H]
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        return out.reshape(x.shape)
