"""Where a continuously batched engine's time goes at a fixed concurrency: prefill vs rounds.

The serving loop's work without HTTP: `--concurrency` rows kept busy from a queue of the tiny
pair's held-out prompts (64 in / `--tokens` out, greedy), as `dflash-tune serve`'s engine loop
does: finished rows are released and refilled (one admission, one prefill, per new request)
between rounds. Reported: output tok/s, and the wall seconds in admissions (prefill, eager in
every mode) and in rounds, with their shares. With `--compile inductor` every round shape is
compiled first (`LiveBatch.capture`), as the server does before it listens.

    OMP_NUM_THREADS=1 python bench/continuous_profile.py [--method dflash] [--concurrency 8] \
        [--requests 32] [--tokens 64] [--compile inductor] [--context-bucket 64]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from dflash_core import SamplingParams, Spec, build_engine, load_models
from dflash_core.training.evaluate import held_out_prompts
from dflash_core.training.pair import ensure_pair

SPECS = {"plain": Spec.none(), "dflash": Spec.of("dflash", 8),
         "ddtree16": Spec.of("ddtree", 8, budget=16, topk=4)}


def serve_queue(batch, prompts: list[list[int]], tokens: int) -> dict:
    """Run every prompt through `batch`, refilling free rows between rounds -> the seconds in
    admissions and in rounds, and the tokens generated."""
    sampling = SamplingParams(max_tokens=tokens)
    queue, admit_s, round_s, generated = list(prompts), 0.0, 0.0, 0
    while queue or batch.live_rows():
        free = [b for b in batch.free_rows() if batch.requests[b] is not None]
        for row in free:
            generated += len(batch.requests[row].output)
            batch.release(row)
        room = min(len(batch.free_rows()), len(queue))
        if room:
            began = time.perf_counter()
            batch.admit(queue[:room], [sampling] * room)
            admit_s += time.perf_counter() - began
            del queue[:room]
        began = time.perf_counter()
        batch.step()
        round_s += time.perf_counter() - began
    generated += sum(len(r.output) for r in batch.requests if r is not None)
    return {"admit_s": admit_s, "round_s": round_s, "tokens": generated}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="dflash", choices=sorted(SPECS))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--compile", default="none")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--context-bucket", type=int, default=0,
                        help="EngineConfig.context_bucket (0: exact reads, 256 with compile)")
    args = parser.parse_args()
    pair = ensure_pair()
    target, drafter = load_models(pair / "target", pair / "drafter", "float32")
    spec = SPECS[args.method]
    buckets = tuple(b for b in (1, 2, 4, 8) if b <= args.concurrency) or (args.concurrency,)
    engine = build_engine(target, drafter if spec.method != "none" else None,
                          max_batch=args.concurrency, max_context=256,
                          max_tree_nodes=spec.num_nodes, batch_buckets=buckets,
                          compile=args.compile, context_bucket=args.context_bucket)
    prompts = [p[:64] for p in held_out_prompts(pair)][:args.requests]
    with torch.inference_mode():
        batch = engine.open_batch(spec)
        if engine.config.fixed_shapes:
            began = time.perf_counter()
            made = batch.capture()
            print(f"compiled {made} graphs in {time.perf_counter() - began:.0f} s",
                  file=sys.stderr)
        serve_queue(batch, prompts[:args.concurrency], 8)  # warm-up: first calls, prefill
        runs = [serve_queue(batch, prompts, args.tokens) for _ in range(args.repeats)]
    print("| method | compile | read bucket | conc. | tok/s | admissions s (share) "
          "| rounds s (share) |")
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        wall = r["admit_s"] + r["round_s"]
        print(f"| {args.method} | {args.compile} | {engine.config.context_bucket} "
              f"| {args.concurrency} | {r['tokens'] / wall:.0f} "
              f"| {r['admit_s']:.2f} ({r['admit_s'] / wall:.0%}) "
              f"| {r['round_s']:.2f} ({r['round_s'] / wall:.0%}) |")
    print(f"\n{os.uname().nodename}, {torch.get_num_threads()} torch threads, load "
          f"{os.getloadavg()[0]:.1f}, {args.requests} requests x {args.tokens} tokens",
          file=sys.stderr)


if __name__ == "__main__":
    main()
