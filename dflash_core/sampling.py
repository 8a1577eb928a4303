"""Target-side sampling, shared by plain and speculative decoding.

Sampling uses the exponential race (argmax of p / Exp(1) noise), which draws from p without a
host sync and treats every tree node independently, as the acceptance walk requires.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dflash_core.spec import SamplingParams


def filtered_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """Temperature, then top-k, then top-p; removed tokens get -inf. logits: [..., V] fp32."""
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        logits = _top_p(logits, params.top_p)
    return logits


def _top_p(logits: Tensor, top_p: float) -> Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs  # keep a token while the mass before it is < top_p
    drop_sorted = mass_before >= top_p
    drop = torch.empty_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocab order
    return logits.masked_fill(drop, float("-inf"))


def sample(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> Tensor:
    """logits: [..., V] -> token ids [...]."""
    if params.greedy:
        return logits.argmax(-1)
    probs = filtered_logits(logits.float(), params).softmax(-1)
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / noise).argmax(-1)
