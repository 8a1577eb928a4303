"""What the engine's round needs of a target's cache, whatever its attention stores per token.

Qwen3 keeps per-head K/V (`kv_cache.KVCache`), MLA one latent vector per token
(`latent_cache.LatentCache`); both store tensors [layers, B, H, S, D] in the same slot layout
(committed tokens at [0, length), nothing read past it) and take a round's new nodes the same
way: `NodeWrites` holds them through the verify forward and writes only the accepted path.
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

    # Every layer's values of new tokens at `slots` [B, N]: `nodes` holds, per stored tensor in
    # field order, [layers, B, H, N, D] (what NodeWrites collects).
    def write_nodes(self, slots: Tensor, nodes: tuple[Tensor, ...]) -> None: ...

    def row_range(self, batch: int) -> Cache: ...  # the first `batch` rows, as a view

    def row(self, b: int) -> Cache: ...  # row b as a batch-1 view

    # A prefill's tokens (`nodes` as in write_nodes, N = P) into rows `index` [n], slots [0, P).
    def put_rows(self, index: Tensor, nodes: tuple[Tensor, ...]) -> None: ...


def slot_index(slots: Tensor, heads: int, capacity: int) -> Tensor:
    """slots [B, N] -> [B*H*N]: where (row b, head h, slots[b, n]) sits among B*H*capacity
    rows of D values, in (b, h, n) order: the index of `put_slots` and `take_slots`."""
    b = slots.shape[0]
    rows = torch.arange(b * heads, device=slots.device).view(b, heads, 1) * capacity
    return (rows + slots[:, None, :]).flatten()


def put_slots(stored: Tensor, index: Tensor, values: Tensor) -> None:
    """stored [..., B, H, S, D] <- values [..., B, H, N, D] at `slot_index(slots, H, S)`, the
    leading dims (layers) alike, as one copy of D-wide rows (a scatter moves element by element:
    7x slower on a CPU for a chain's writes at 8 rows, measured)."""
    *lead, b, h, s, d = stored.shape
    flat = stored.view(*lead, b * h * s, d)  # B, H, S merge in any row range of the cache
    flat.index_copy_(len(lead), index, values.reshape(*lead, -1, d))


def take_slots(values: Tensor, index: Tensor, count: int) -> Tensor:
    """values [..., B, H, N, D] -> [..., B, H, count, D]: the entries at `slot_index(slots, H,
    N)` for slots [B, count]."""
    *lead, b, h, n, d = values.shape
    picked = values.reshape(*lead, b * h * n, d).index_select(len(lead), index)
    return picked.view(*lead, b, h, count, d)


class NodeWrites:
    """A cache as a verify forward sees it: prefixes are read from `cache`, the new tokens'
    values are held instead of written, and `commit` writes only the accepted path's nodes.

    So a tree's rejected nodes never reach the cache and its accepted ones need no move: the
    round writes A nodes a row once instead of writing N and then moving the path down
    (docs/BENCHMARKS.md, "Engine internals"). Exact: a forward's layers read their prefix
    before their own write and take the new tokens' K/V from the forward itself, so nothing in
    the forward ever reads a node it wrote. The attentions call `write(layer, slots, *values)`,
    the values being the stored tensors' in field order; the slots are not kept, since node i of
    a verify (or prefill) goes to start + i, which is how `commit` (and `put_rows`) place them.
    """

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self._layers: dict[int, tuple[Tensor, ...]] = {}
        self._nodes: tuple[Tensor, ...] | None = None

    def prefix(self, layer: int, length: int):
        return self.cache.prefix(layer, length)

    def write(self, layer: int, slots: Tensor, *values: Tensor) -> None:
        self._layers[layer] = values

    def hold(self, nodes: tuple[Tensor, ...]) -> None:
        """The nodes already stacked ([layers, B, H, N, D] each): a compiled forward's output."""
        self._nodes = nodes

    def nodes(self) -> tuple[Tensor, ...]:
        """Per stored tensor, every layer's new values: [layers, B, H, N, D]."""
        if self._nodes is None:
            per_layer = [self._layers[i] for i in sorted(self._layers)]
            self._nodes = tuple(torch.stack(parts) for parts in zip(*per_layer))
        return self._nodes

    def commit(self, starts: Tensor, path: Tensor | None, path_len: int) -> None:
        """Node path[:, j] at slot starts + j, j < path_len; `path` [B, A] node indices, or None
        for a chain (nodes 0..A-1 in order: no gather). Entries past a row's accepted length
        land past its new committed length, where nothing reads."""
        nodes = self.nodes()  # each [layers, B, H, N, D]
        if path is not None:  # every stored tensor has the same B, H, N
            index = slot_index(path, nodes[0].shape[2], nodes[0].shape[3])
            nodes = tuple(take_slots(x, index, path_len) for x in nodes)  # [layers, B, H, A, D]
        else:
            nodes = tuple(x[:, :, :, :path_len] for x in nodes)
        slots = starts[:, None] + torch.arange(path_len, device=starts.device)  # [B, A]
        self.cache.write_nodes(slots, nodes)
