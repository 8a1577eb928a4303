"""The DDTree build, before and after issue 18's tenth pass, compiled, timed in turns.

Before: the build took the drafter's logits log-softmaxed (a float32 copy of [B, L, V]) and
ranked each depth's tokens on an int64 key (float32 bits, then the token id) made over all V.
After: it ranks the raw logits (the log-prob order, less float32 merges) and normalises only
the K picked per depth (`depth_logprobs`: a logsumexp over V, no [B, L, V] copy); bf16 logits
rank on an int32 key (their 16 bits, then the id), half the bytes for the V-wide pass and the
topk. Both are compiled with Inductor per shape, as `CompiledTreeStages` compiles the build.
Shapes are the tiny pair's (V = 2048, block 8: 7 drafted positions), the logits random normal
x 3; each variant's trees are compared before timing (rows whose tree differs are counted: a
float32 near-tie can fall either way between log_softmax and x - logsumexp).

    python bench/tree_build_bench.py [--rows 1,8] [--dtypes float32,bfloat16]
        [--budgets 7,16] [--topk 4] [--repeats 5] [--calls 300]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from functools import partial

import torch

from dflash_core.speculation import tree as trees

VOCAB, POSITIONS = 2048, 7


def before(anchors, logits, budget: int, topk: int) -> trees.Tree:
    """The ninth pass's build: log_softmax, then the int64 key over the log-probs."""
    lp = logits.float().log_softmax(-1) + 0.0
    bits = lp.view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()
    token = torch.arange(lp.shape[-1])
    ids = (ordered * (1 << 32) + (0xFFFFFFFF - token)).topk(topk, dim=-1).indices
    levels = trees._expand_levels(lp.gather(-1, ids), ids, budget, False)
    return trees._select(anchors, levels, budget, lp.shape[1])


def after(anchors, logits, budget: int, topk: int) -> trees.Tree:
    return trees.build_tree(anchors, logits, budget, topk, logits.shape[1], False)


def time_ms(fn, calls: int) -> float:
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - began) / calls * 1e3


def differing_rows(a: trees.Tree, b: trees.Tree) -> int:
    same = (a.tokens == b.tokens).all(1) & (a.parents == b.parents).all(1)
    return int((~same).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--budgets", default="7,16")
    parser.add_argument("--topk", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    print("| dtype | rows | budget | before ms | after ms | after / before (range) "
          "| rows differing |\n|---|---|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        for rows in (int(r) for r in args.rows.split(",")):
            for budget in (int(b) for b in args.budgets.split(",")):
                logits = (torch.randn(rows, POSITIONS, VOCAB, generator=gen) * 3).to(
                    getattr(torch, dtype))
                anchors = torch.randint(0, VOCAB, (rows,), generator=gen)
                variants = {name: torch.compile(fn, dynamic=False)
                            for name, fn in (("before", before), ("after", after))}
                built = {n: f(anchors, logits, budget, args.topk) for n, f in variants.items()}
                differ = differing_rows(built["before"], built["after"])
                calls = {n: partial(f, anchors, logits, budget, args.topk)
                         for n, f in variants.items()}
                for call in calls.values():  # warm past the first calls
                    time_ms(call, 20)
                runs = {n: [] for n in variants}
                for _ in range(args.repeats):
                    for n, call in calls.items():
                        runs[n].append(time_ms(call, args.calls))
                ratios = [a / b for a, b in zip(runs["after"], runs["before"])]
                print(f"| {dtype} | {rows} | {budget} | {statistics.median(runs['before']):.3f} "
                      f"| {statistics.median(runs['after']):.3f} | {statistics.median(ratios):.2f} "
                      f"({min(ratios):.2f}-{max(ratios):.2f}) | {differ} |")
    print(f"\n{platform.node()} {platform.machine()} ({torch.backends.cpu.get_cpu_capability()}), "
          f"1 thread, load {os.getloadavg()[0]:.1f}, top-k {args.topk}, {args.repeats} repeats "
          f"x {args.calls} calls, torch {torch.__version__}")


if __name__ == "__main__":
    main()
