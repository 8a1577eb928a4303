"""Eager vs `--compile inductor` per decode round on the tiny pair: ms per round, warm-up, tokens.

For each method and batch, three engines: eager with exact reads (the default), eager and
compiled with the same context bucket (so both read the same padded prefix). Each runs the
batch once as its warm-up (it pays every compile; its seconds and the compiled graphs are
reported), then the three run it `--repeats` more times in turn, timed, steps only (prefill is
not timed); medians are reported, and the tokens of the three are compared.

    OMP_NUM_THREADS=1 python bench/compile_bench.py [--methods plain,dflash] [--batches 1,8] \
        [--context-bucket 64] [--tokens 48] [--compile inductor] [--repeats 5] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from dflash_core import SamplingParams, Spec, build_engine, load_models
from dflash_core.training.pair import ensure_pair

SPECS = {"plain": Spec.none(), "dflash": Spec.of("dflash", 8),
         "ddtree": Spec.of("ddtree", 8, budget=15, topk=4)}


def run(engine, spec: Spec, prompts: list[list[int]], tokens: int) -> tuple[float, int, list]:
    """-> (seconds in steps, rounds, tokens per row) of one batch to the end."""
    batch = engine.open_batch(spec, len(prompts))
    batch.admit(prompts, [SamplingParams(max_tokens=tokens)] * len(prompts))
    step_s = 0.0
    while batch.live_rows():
        began = time.perf_counter()
        batch.step()
        step_s += time.perf_counter() - began
    return step_s, batch.stats.rounds, [r.output for r in batch.requests]


def row(target, drafter, spec: Spec, prompts: list[list[int]], args, method: str) -> str:
    """One table row: three engines warmed up, then `repeats` timed runs of each in turn (on a
    shared machine alternating spreads load swings over all three; medians reported)."""
    modes = {"exact": ("none", 0), "eager": ("none", args.context_bucket),
             "compiled": (args.compile, args.context_bucket)}
    engines, warm_s = {}, {}
    for name, (mode, bucket) in modes.items():
        engines[name] = build_engine(target, drafter, max_batch=8, max_context=256,
                                     max_tree_nodes=64, compile=mode, context_bucket=bucket)
        began = time.perf_counter()
        run(engines[name], spec, prompts, args.tokens)
        warm_s[name] = time.perf_counter() - began
    ms, tokens = {name: [] for name in modes}, {}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            step_s, rounds, tokens[name] = run(engine, spec, prompts, args.tokens)
            ms[name].append(step_s / rounds * 1e3)
    exact, eager, comp = (statistics.median(ms[name]) for name in modes)
    same = tokens["exact"] == tokens["eager"] == tokens["compiled"]
    return (f"| {method} | {len(prompts)} | {exact:.2f} | {eager:.2f} | {comp:.2f} | "
            f"{comp / eager:.2f} | {warm_s['eager']:.1f}, {warm_s['compiled']:.1f} | "
            f"{sum(g.compiles for g in engines['compiled'].compiled_graphs())} | {same} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="plain,dflash")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--context-bucket", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--compile", default="inductor")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32", help="the engines' dtype (vLLM: bf16)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = ensure_pair()
    target, drafter = load_models(pair / "target", pair / "drafter", args.dtype)
    held_out = [p[:64] for p in json.loads((pair / "heldout_prompts.json").read_text())[:8]]
    print(f"{os.uname().nodename}, {torch.get_num_threads()} thread, load "
          f"{os.getloadavg()[0]:.1f}, {args.dtype}, context bucket {args.context_bucket}, {args.tokens} "
          f"tokens", file=sys.stderr)
    print("| method | batch | eager, exact reads | eager | compiled | compiled / eager | "
          "warm-up s (eager, compiled) | graphs | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for method in args.methods.split(","):
            for b in (int(x) for x in args.batches.split(",")):
                print(row(target, drafter, SPECS[method], held_out[:b], args, method),
                      flush=True)


if __name__ == "__main__":
    main()
