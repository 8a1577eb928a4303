"""Static KV cache: preallocated once, written at explicit slots.

Layout per request row: committed tokens at slots [0, length). A round's verify holds its tree
nodes' K/V (`cache.NodeWrites`) and writes only the accepted path, at [length, length + A);
entries of that path past a row's accepted length sit past the committed length, where no one
reads, until the next round overwrites them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dflash_core.models.cache import put_slots, slot_index


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
        keys, values = self.layer(layer)
        index = slot_index(slots, keys.shape[1], keys.shape[2])
        put_slots(keys, index, k)
        put_slots(values, index, v)

    def prefix(self, layer: int, length: int) -> tuple[Tensor, Tensor]:
        """The first `length` slots of every row (callers mask each row's own length)."""
        keys, values = self.layer(layer)
        return keys[:, :, :length], values[:, :, :length]

    def layer(self, layer: int) -> tuple[Tensor, Tensor]:
        """k, v of one layer: [B, Hkv, S, D] views."""
        if layer not in self._layers:
            self._layers[layer] = self.k[layer], self.v[layer]
        return self._layers[layer]

    def write_nodes(self, slots: Tensor, nodes: tuple[Tensor, ...]) -> None:
        """nodes: (k, v), each [layers, B, Hkv, N, D], at slots [B, N]."""
        index = slot_index(slots, self.k.shape[2], self.capacity)
        put_slots(self.k, index, nodes[0])
        put_slots(self.v, index, nodes[1])

    def put_rows(self, index: Tensor, nodes: tuple[Tensor, ...]) -> None:
        """nodes: (k, v), each [layers, n, Hkv, P, D], into rows `index` [n], slots [0, P)."""
        length = nodes[0].shape[3]
        self.k[:, index, :, :length] = nodes[0]
        self.v[:, index, :, :length] = nodes[1]

    def row_range(self, batch: int) -> KVCache:
        """The first `batch` rows as a view (a cache allocated for max_batch serves smaller ones)."""
        return KVCache(self.k[:, :batch], self.v[:, :batch])

    def row(self, b: int) -> KVCache:
        """A batch-1 view of row b (writes go to the shared storage)."""
        return KVCache(self.k[:, b : b + 1], self.v[:, b : b + 1])

