"""What a round's prefix read length costs: one round's ms per (rows, read length), same rows.

A round's attentions (verify and the drafter's block pass) read `read_len` prefix slots of every
row whatever the rows' real lengths are (the rest is masked), so the read bucket a context
falls in is paid in full. This times `Round.step` on the tiny pair for each read length at a
few row counts, the shapes in turns and `--repeats` times so drift hits all of them, and
reports the median ms and the ratio to the shortest read: why reads below the context bucket
round up to a power of two (`RoundShapes.read_len`).

    OMP_NUM_THREADS=1 python bench/read_len_bench.py [--method dflash] [--rows 1,4,8]
        [--reads 64,128,256] [--dtype bfloat16] [--compile inductor] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from dflash_core import Spec, build_engine, load_models
from dflash_core.training.pair import ensure_pair

SPECS = {"plain": Spec.none(), "dflash": Spec.of("dflash", 8),
         "ddtree7": Spec.of("ddtree", 8, budget=7, topk=4)}
ROUNDS = 30  # per shape and repeat


def time_round(batch, rows: int, read_len: int) -> float:
    """Median seconds of ROUNDS rounds of one shape (every row idle: a round's cost does not
    depend on what its rows hold, only on its shape)."""
    times = []
    for _ in range(ROUNDS):
        began = time.perf_counter()
        batch.round.step(rows, read_len, "greedy", False)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="dflash", choices=sorted(SPECS))
    parser.add_argument("--rows", default="1,4,8", help="comma list")
    parser.add_argument("--reads", default="64,128,256", help="comma list of read lengths")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--compile", default="inductor", help="EngineConfig.compile")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    reads = sorted(int(r) for r in args.reads.split(","))
    pair = ensure_pair()
    target, drafter = load_models(pair / "target", pair / "drafter", args.dtype)
    spec = SPECS[args.method]
    engine = build_engine(target, drafter if spec.method != "none" else None,
                          max_batch=max(rows), max_context=max(reads),
                          max_tree_nodes=spec.num_nodes, batch_buckets=tuple(rows),
                          compile=args.compile, context_bucket=min(reads))
    runs: dict[tuple[int, int], list[float]] = {}
    with torch.inference_mode():
        batch = engine.open_batch(spec, max(rows))
        batch.state.starts.zero_()
        for n in rows:  # first calls (compiles), outside the timing
            for read_len in reads:
                batch.round.step(n, read_len, "greedy", False)
        for _ in range(args.repeats):
            for n in rows:
                for read_len in reads:
                    runs.setdefault((n, read_len), []).append(time_round(batch, n, read_len))
    print("| method | rows | read | ms per round, median (spread) | / shortest read |")
    print("|---|---|---|---|---|")
    for n in rows:
        shortest = statistics.median(runs[n, reads[0]]) * 1e3
        for read_len in reads:
            ms = [t * 1e3 for t in runs[n, read_len]]
            median = statistics.median(ms)
            print(f"| {args.method} | {n} | {read_len} | {median:.2f} "
                  f"({(max(ms) - min(ms)) / median:.0%}) | {median / shortest:.2f} |")
    print(f"\n{os.uname().nodename}, {torch.get_num_threads()} torch threads, {args.dtype}, "
          f"compile {args.compile}, load {os.getloadavg()[0]:.1f}, {args.repeats} repeats x "
          f"{ROUNDS} rounds", file=sys.stderr)


if __name__ == "__main__":
    main()
