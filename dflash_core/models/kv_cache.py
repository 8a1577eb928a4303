"""Static KV cache: preallocated once, written at explicit slots, compacted in place on commit.

Layout per request row: committed tokens at slots [0, length); a round's tree nodes are written
at scratch slots [length, length + N) (node i at length + i). Committing an accepted path copies
its nodes down to [length, length + a + 1). Rejected nodes are never cleaned up: they sit past
the committed length, where no one reads, until the next round overwrites them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dflash_core.models.cache import move_path


@dataclass
class KVCache:
    k: Tensor  # [layers, B, Hkv, S, D]
    v: Tensor  # [layers, B, Hkv, S, D]

    def __post_init__(self) -> None:
        # Each layer's k and v views, made on first use: a layer's read and write then share
        # one select each (not unbind: its views may not be written in place outside inference
        # mode). An attribute, not a field: a cache's fields are its tensors.
        self._layers: dict[int, tuple[Tensor, Tensor]] = {}

    @classmethod
    def allocate(cls, layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> KVCache:
        shape = (layers, batch, kv_heads, capacity, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(shape, dtype=dtype, device=device))

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def rows(self) -> int:
        return self.k.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    def write(self, layer: int, slots: Tensor, k: Tensor, v: Tensor) -> None:
        """slots: [B, N]; k, v: [B, Hkv, N, D]."""
        self.write_at(layer, scatter_index(slots, k), k, v)

    def write_at(self, layer: int, index: Tensor, k: Tensor, v: Tensor) -> None:
        """index: scatter_index(slots, k), made once per forward for all layers."""
        keys, values = self.layer(layer)
        keys.scatter_(2, index, k)
        values.scatter_(2, index, v)

    def prefix(self, layer: int, length: int) -> tuple[Tensor, Tensor]:
        """The first `length` slots of every row (callers mask each row's own length)."""
        keys, values = self.layer(layer)
        return keys[:, :, :length], values[:, :, :length]

    def layer(self, layer: int) -> tuple[Tensor, Tensor]:
        """k, v of one layer: [B, Hkv, S, D] views."""
        if layer not in self._layers:
            self._layers[layer] = self.k[layer], self.v[layer]
        return self._layers[layer]

    def commit(self, starts: Tensor, path: Tensor) -> None:
        """Move path nodes (scratch index, [B, A]) to contiguous slots starts + 0..A-1."""
        move_path(self.k, starts, path)
        move_path(self.v, starts, path)

    def put_rows(self, index: Tensor, scratch: KVCache) -> None:
        length = scratch.capacity
        self.k[:, index, :, :length] = scratch.k
        self.v[:, index, :, :length] = scratch.v

    def row_range(self, batch: int) -> KVCache:
        """The first `batch` rows as a view (a cache allocated for max_batch serves smaller ones)."""
        return KVCache(self.k[:, :batch], self.v[:, :batch])

    def row(self, b: int) -> KVCache:
        """A batch-1 view of row b (writes go to the shared storage)."""
        return KVCache(self.k[:, b : b + 1], self.v[:, b : b + 1])


def scatter_index(slots: Tensor, k: Tensor) -> Tensor:
    """slots [B, N] -> the scatter index [B, Hkv, N, D] that writes k's nodes at those slots."""
    return slots[:, None, :, None].expand_as(k)
