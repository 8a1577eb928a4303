"""Plain reference versions of what the engine does batched, kept out of the hot-path modules:
the tests check the engine against them."""

from __future__ import annotations

import torch
from torch import Tensor

from dflash_core.speculation.proposer import DFlashProposer, DraftInput
from dflash_core.speculation.spec import SamplingParams


def filtered_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """One request's processing: temperature, then top-k, then top-p; removed tokens get -inf.
    logits: [..., V] fp32. `sampling.table_filtered_logits` must equal it row by row."""
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        logits = _top_p(logits, params.top_p)
    return logits


def _top_p(logits: Tensor, top_p: float) -> Tensor:
    # Stable, so tied tokens at the top-p edge are kept in the same order as in sample_table.
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs  # keep a token while the mass before it is < top_p
    drop_sorted = mass_before >= top_p
    drop = torch.empty_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocab order
    return logits.masked_fill(drop, float("-inf"))


def sample(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> Tensor:
    """One request's draw by the exponential race: logits [..., V] -> token ids [...]."""
    if params.greedy:
        return logits.argmax(-1)
    probs = filtered_logits(logits.float(), params).softmax(-1)
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / noise).argmax(-1)


class MaskedAnchorProposer(DFlashProposer):
    """A known porting bug, kept as a regression guard: every block slot holds MASK, so the
    drafter never sees the real anchor token. Acceptance must collapse with it."""

    def propose(self, draft: DraftInput) -> Tensor:
        draft.anchors = torch.full_like(draft.anchors, self.drafter.config.mask_token_id)
        return super().propose(draft)
