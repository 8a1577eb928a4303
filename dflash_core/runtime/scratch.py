"""A sequence the target alone reads causally into a cache of its own, beside a live batch's
rounds: teacher-forced scoring (a server's logprobs). The rounds keep no per-token distributions
(a verify's logits are sampled and dropped inside the round), so a caller that wants them feeds
the tokens here. Over several ranks it is a target forward like any other: every rank makes the
same call (the mirror sends it, `LiveBatch.feed_scratch`) and every rank gets the gathered
logits."""

from __future__ import annotations

import torch
from torch import Tensor

from dflash_core.models.step import Step
from dflash_core.models.target import Target


class ScratchSequence:
    def __init__(self, target: Target, capacity: int, fused: bool = False) -> None:
        self.target, self.fused = target, fused
        self.device = target.lm_head.weight.device
        self.cache = target.allocate_cache(1, capacity)
        self.length = 0

    def feed(self, ids: list[int]) -> Tensor:
        """Append ids to the sequence -> the logits after each of them [len(ids), V] fp32."""
        if not ids:
            return torch.empty(0, self.target.config.vocab_size, device=self.device)
        starts = torch.tensor([self.length], device=self.device)
        step = Step.causal(starts, len(ids), self.length, self.fused)
        tokens = torch.tensor([ids], device=self.device)  # [1, n]
        hidden, _ = self.target(tokens, step, self.cache)  # [1, n, H]
        self.length += len(ids)
        return self.target.logits(hidden)[0]  # [n, V]
