"""What the engine's round needs of a target's cache, whatever its attention stores per token.

Qwen3 keeps per-head K/V (`kv_cache.KVCache`), MLA one latent vector per token
(`latent_cache.LatentCache`); both use the same slot layout (committed tokens at [0, length),
a round's tree nodes at scratch slots after them) and the same commit-by-path.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class Cache(Protocol):
    @property
    def rows(self) -> int: ...  # request rows it was allocated for

    @property
    def capacity(self) -> int: ...  # slots per row

    @property
    def dtype(self) -> torch.dtype: ...

    def commit(self, starts: Tensor, path: Tensor) -> None: ...  # path: [B, A] scratch indices

    def row_range(self, batch: int) -> Cache: ...  # the first `batch` rows, as a view

    def row(self, b: int) -> Cache: ...  # row b as a batch-1 view

    # Copy a scratch cache's rows (a prefill) into rows `index` [n], slots [0, its capacity).
    def put_rows(self, index: Tensor, scratch: Cache) -> None: ...


def move_path(cache: Tensor, starts: Tensor, path: Tensor) -> None:
    """Commit for one stored tensor [L, B, H, S, D]: path nodes (scratch index, [B, A]) move to
    the contiguous slots starts + 0..A-1.

    Path entries past a row's accepted length are harmless: they land beyond the new committed
    length. No re-rotation: node j of the path was computed at position start + j, its final
    position. All sources are gathered before any slot is written."""
    src = starts[:, None] + path  # [B, A]
    dst = starts[:, None] + torch.arange(path.shape[1], device=path.device)  # [B, A]
    shape = (cache.shape[0], cache.shape[1], cache.shape[2], path.shape[1], cache.shape[4])
    moved = cache.gather(3, src[None, :, None, :, None].expand(shape))  # [L, B, H, A, D]
    cache.scatter_(3, dst[None, :, None, :, None].expand(shape), moved)
