"""Where draft logits come from: the DFlash drafter, or any object with the same two methods.

The engine hands a proposer the target features of the positions committed since the last call
and the anchors; the proposer returns logits for the next L positions. Tests and benchmarks swap
in an oracle proposer with a controlled acceptance profile through the same interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from dflash_core.models.drafter import Drafter
from dflash_core.models.kv_cache import KVCache
from dflash_core.models.step import Step
from dflash_core.models.target import Target


@dataclass(slots=True)
class DraftInput:
    features: Tensor  # [B, A, F] target features of the last round's accepted path (entries
    #                   past a row's acceptance are padding: they land past its prefix, unread)
    feature_positions: Tensor  # [B, A]
    anchors: Tensor  # [B] token at position `starts`
    starts: Tensor  # [B] anchor position = committed length
    read_len: int  # max start over the batch
    block_size: int  # this round's block (<= the drafter's trained block)
    fused: bool = False  # attend with fused kernels (attention.attend)


class Proposer(Protocol):
    block_size: int  # the largest block it can draft
    tap_layers: list[int]  # target layers whose outputs it needs

    def begin(self, batch: int, capacity: int) -> None: ...

    # A new request's prompt context, written at admission so rounds keep one shape.
    def absorb(self, rows: list[int], features: Tensor, positions: Tensor) -> None: ...

    def propose(self, draft: DraftInput) -> Tensor: ...  # [B, block_size - 1, V] logits


class DFlashProposer:
    def __init__(self, drafter: Drafter, target: Target) -> None:
        drafter.config.check_target(target.config)
        self.drafter, self.target = drafter, target
        self.block_size = drafter.config.block_size
        self.tap_layers = list(drafter.config.target_layer_ids)
        self.cache = None

    def begin(self, batch: int, capacity: int) -> None:
        if self.cache is None or self.cache.k.shape[1] < batch or self.cache.capacity < capacity:
            self.cache = self.drafter.allocate_cache(batch, capacity)

    def absorb(self, rows: list[int], features: Tensor, positions: Tensor) -> None:
        """features: [n, P, F] at positions [P] for cache rows `rows` (admission: not hot)."""
        for i, row in enumerate(rows):
            self.drafter.write_context(features[i : i + 1], positions[None], self.cache.row(row))

    def propose(self, draft: DraftInput) -> Tensor:
        cache = self.write_round_context(draft)
        return self.block_logits(draft.anchors, draft.starts, draft.read_len, draft.block_size,
                                 draft.fused, cache)

    def write_round_context(self, draft: DraftInput) -> KVCache:
        """The last round's accepted features into the cache; -> the round's rows of it."""
        cache = self.cache.row_range(len(draft.starts))
        self.drafter.write_context(draft.features, draft.feature_positions, cache)
        return cache

    def block_logits(self, anchors: Tensor, starts: Tensor, read_len: int, bs: int,
                     fused: bool, cache: KVCache) -> Tensor:
        """The block pass, which writes nothing (what runtime/compiled.py compiles)."""
        masks = torch.full((len(starts), bs - 1), self.drafter.config.mask_token_id,
                           device=anchors.device)
        block = torch.cat([anchors[:, None], masks], dim=1)  # [B, bs]: slot 0 = real anchor
        step = Step.causal(starts, bs, read_len, fused)
        step.mask = torch.ones_like(step.mask)  # non-causal inside the block
        hidden = self.drafter(self.target.embed(block), step, cache)  # [B, bs, H]
        return self.target.logits(hidden[:, 1:])  # [B, bs - 1, V]: slot j predicts start + j
