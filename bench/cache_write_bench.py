"""A round's target-cache writes, before and after issue 18's ninth pass, timed in turns.

Before: the verify wrote each layer's N new K/V with an element-wise `scatter_` (2 per layer),
and a DDTree commit then gathered the accepted path out of the cache and scattered it down
(`gather` + `scatter_` over every layer, K and V). After: the verify's K/V are held
(`cache.NodeWrites`), a tree's path is picked from them (`index_select`) and written once with
`index_copy_` over the flattened (row, head, slot) axis, one call per stored tensor; a chain
(plain, DFlash) writes its nodes in order with no pick. Shapes are the tiny pair's (5 layers,
2 KV heads of 32, bf16, a 320-slot cache, blocks of 8 nodes); the K/V values are random, the
slots and paths those of real rounds (rows at different lengths, a path of distinct nodes).
Each variant's result is checked against the other's before timing.

    python bench/cache_write_bench.py [--rows 1,8] [--repeats 5] [--calls 300]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

from dflash_core.models.cache import NodeWrites
from dflash_core.models.kv_cache import KVCache

LAYERS, HEADS, DIM, SLOTS, NODES = 5, 2, 32, 320, 8


def scatter_round(cache: KVCache, layer_kv, starts, path, tree: bool) -> None:
    """The writes as they were: per-layer scatters of every node, then a tree's path move."""
    slots = starts[:, None] + torch.arange(NODES)
    index = slots[:, None, :, None].expand(-1, HEADS, -1, DIM)  # [B, H, N, D]
    for layer, (k, v) in enumerate(layer_kv):
        cache.k[layer].scatter_(2, index, k)
        cache.v[layer].scatter_(2, index, v)
    if tree:
        for stored in (cache.k, cache.v):
            src = starts[:, None] + path
            shape = (LAYERS, len(starts), HEADS, path.shape[1], DIM)
            moved = stored.gather(3, src[None, :, None, :, None].expand(shape))
            stored.scatter_(3, slots[None, :, None, :, None].expand(shape), moved)


def row_round(cache: KVCache, layer_kv, starts, path, tree: bool) -> None:
    """The writes as they are: the held nodes, the path written once (round.Round._commit)."""
    nodes = NodeWrites(cache)
    for layer, (k, v) in enumerate(layer_kv):
        nodes.write(layer, None, k, v)
    nodes.commit(starts, path if tree else None, NODES)


def inputs(rows: int, tree: bool, seed: int):
    gen = torch.Generator().manual_seed(seed)
    layer_kv = [tuple(torch.randn(rows, HEADS, NODES, DIM, generator=gen).bfloat16()
                      for _ in range(2)) for _ in range(LAYERS)]
    starts = torch.randint(64, 200, (rows,), generator=gen)
    # A tree's path: the root, then distinct nodes at rising depths (a chain's: 0..N-1).
    path = torch.stack([torch.cat([torch.zeros(1, dtype=torch.long),
                                   torch.randperm(NODES - 1, generator=gen)[:NODES - 1] + 1])
                        for _ in range(rows)]) if tree else torch.arange(NODES).expand(rows, -1)
    return layer_kv, starts, path


def fresh(rows: int) -> KVCache:
    return KVCache.allocate(LAYERS, rows, HEADS, SLOTS, DIM, torch.bfloat16, "cpu")


def check(rows: int, tree: bool) -> None:
    """Both leave the committed slots [start, start + N) of every row alike."""
    args = inputs(rows, tree, seed=1)
    old, new = fresh(rows), fresh(rows)
    scatter_round(old, *args, tree)
    row_round(new, *args, tree)
    starts = args[1]
    for b, s in enumerate(starts.tolist()):
        for a, c in ((old.k, new.k), (old.v, new.v)):
            if not torch.equal(a[:, b, :, s:s + NODES], c[:, b, :, s:s + NODES]):
                raise SystemExit(f"the two writes disagree (rows {rows}, tree {tree}, row {b})")


def per_call_us(fn, cache, args, tree: bool, calls: int) -> float:
    began = time.perf_counter()
    for _ in range(calls):
        fn(cache, *args, tree)
    return 1e6 * (time.perf_counter() - began) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| rows | round | before: scatters us (spread) | after: row copies us (spread) "
          "| after / before (per-repeat range) |")
    print("|---|---|---|---|---|")
    with torch.inference_mode():
        for rows in [int(r) for r in args.rows.split(",")]:
            for tree in (False, True):
                check(rows, tree)
                data, cache = inputs(rows, tree, seed=2), fresh(rows)
                times = {scatter_round: [], row_round: []}
                for _ in range(args.repeats):
                    for fn in times:
                        times[fn].append(per_call_us(fn, cache, data, tree, args.calls))
                before, after = times[scatter_round], times[row_round]
                ratios = [a / b for a, b in zip(after, before)]
                print(f"| {rows} | {'tree' if tree else 'chain'} | {_cell(before)} | "
                      f"{_cell(after)} | {statistics.median(ratios):.2f} "
                      f"({min(ratios):.2f}-{max(ratios):.2f}) |")
    print(f"\n{platform.node()} {platform.machine()}, 1 thread, load {os.getloadavg()[0]:.1f}, "
          f"{args.repeats} repeats x {args.calls} calls, in turns", file=sys.stderr)


def _cell(values: list[float]) -> str:
    median = statistics.median(values)
    return f"{median:.1f} ({100 * (max(values) - min(values)) / median:.0f}%)"


if __name__ == "__main__":
    main()
