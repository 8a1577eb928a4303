"""MLA's static cache: per token one latent vector (kv_lora_rank) and the shared rotary key
(qk_rope_head_dim), concatenated; nothing per head.

Same slot layout and commit as `kv_cache.KVCache`. The one stored tensor is both the keys (all
of it) and the values (the same storage: the attention's output columns past the latent are
dropped), so a prefix read is one pass over one tensor for every head and node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dflash_core.models.cache import move_path


@dataclass(slots=True)
class LatentCache:
    kv: Tensor  # [layers, B, 1, S, kv_lora_rank + qk_rope_head_dim]

    @classmethod
    def allocate(cls, layers: int, batch: int, capacity: int, width: int, dtype: torch.dtype,
                 device: torch.device | str) -> LatentCache:
        return cls(torch.zeros(layers, batch, 1, capacity, width, dtype=dtype, device=device))

    @property
    def capacity(self) -> int:
        return self.kv.shape[3]

    @property
    def rows(self) -> int:
        return self.kv.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.kv.dtype

    def write(self, layer: int, slots: Tensor, latent: Tensor) -> None:
        """slots: [B, N]; latent: [B, 1, N, W]."""
        self.kv[layer].scatter_(2, slots[:, None, :, None].expand_as(latent), latent)

    def prefix(self, layer: int, length: int) -> Tensor:
        """[B, 1, length, W]: the first `length` slots of every row (callers mask the rest)."""
        return self.kv[layer, :, :, :length]

    def commit(self, starts: Tensor, path: Tensor) -> None:
        move_path(self.kv, starts, path)

    def put_rows(self, index: Tensor, scratch: LatentCache) -> None:
        self.kv[:, index, :, : scratch.capacity] = scratch.kv

    def row_range(self, batch: int) -> LatentCache:
        return LatentCache(self.kv[:, :batch])

    def row(self, b: int) -> LatentCache:
        return LatentCache(self.kv[:, b : b + 1])
