"""MLA's static cache: per token one latent vector (kv_lora_rank) and the shared rotary key
(qk_rope_head_dim), concatenated; nothing per head.

Same slot layout and node writes as `kv_cache.KVCache`. The one stored tensor is both the keys (all
of it) and the values (the same storage: the attention's output columns past the latent are
dropped), so a prefix read is one pass over one tensor for every head and node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dflash_core.models.cache import put_slots, slot_index


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
        put_slots(self.kv[layer], slot_index(slots, 1, self.capacity), latent)

    def prefix(self, layer: int, length: int) -> Tensor:
        """[B, 1, length, W]: the first `length` slots of every row (callers mask the rest)."""
        return self.kv[layer, :, :, :length]

    def write_nodes(self, slots: Tensor, nodes: tuple[Tensor, ...]) -> None:
        """nodes: (latents [layers, B, 1, N, W],) at slots [B, N]."""
        put_slots(self.kv, slot_index(slots, 1, self.capacity), nodes[0])

    def put_rows(self, index: Tensor, nodes: tuple[Tensor, ...]) -> None:
        """nodes: (latents [layers, n, 1, P, W],) into rows `index` [n], slots [0, P)."""
        self.kv[:, index, :, : nodes[0].shape[3]] = nodes[0]

    def row_range(self, batch: int) -> LatentCache:
        return LatentCache(self.kv[:, :batch])

    def row(self, b: int) -> LatentCache:
        return LatentCache(self.kv[:, b : b + 1])
