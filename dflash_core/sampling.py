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


def sample_rows(logits: Tensor, samplings: list[SamplingParams | None],
                generator: torch.Generator | None) -> Tensor:
    """logits: [B, N, V] with one SamplingParams per row (None = an idle row) -> [B, N].

    Rows are grouped by how they sample, so a batch where everyone samples alike is one call."""
    groups: dict[tuple, list[int]] = {}
    for b, params in enumerate(samplings):
        groups.setdefault(_sampling_key(params), []).append(b)
    if len(groups) == 1:
        return sample(logits, _params_of(next(iter(groups))), generator)
    out = torch.empty(logits.shape[:-1], dtype=torch.long, device=logits.device)
    for key, rows in groups.items():
        index = torch.tensor(rows, device=logits.device)
        out[index] = sample(logits[index], _params_of(key), generator)
    return out


def _sampling_key(params: SamplingParams | None) -> tuple:
    if params is None or params.greedy:
        return (0.0, 0, 1.0)
    return (params.temperature, params.top_k, params.top_p)


def _params_of(key: tuple) -> SamplingParams:
    return SamplingParams(temperature=key[0], top_k=key[1], top_p=key[2])
