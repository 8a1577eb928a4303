"""Eager vs `--compile inductor` per decode round on the tiny pair: ms per round, warm-up, tokens.

For each method and batch: one engine per mode (eager, then compiled), same EngineConfig
otherwise (the same context bucket, so both read the same padded prefix), and eager with
exact reads (no bucket, the default) beside them. Each engine runs the
same generate twice: the first is the warm-up (it pays every compile; its seconds and the
compiled graphs are reported), the second is timed, its steps only (prefill excluded; it is
eager in both modes). Tokens of the two modes are compared.

    OMP_NUM_THREADS=1 python bench/compile_bench.py [--methods plain,dflash] [--batches 1,8] \
        [--context-bucket 64] [--tokens 48] [--compile inductor]
"""

from __future__ import annotations

import argparse
import json
import os
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="plain,dflash")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--context-bucket", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--compile", default="inductor")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = ensure_pair()
    target, drafter = load_models(pair / "target", pair / "drafter", "float32")
    held_out = [p[:64] for p in json.loads((pair / "heldout_prompts.json").read_text())[:8]]
    print(f"{os.uname().nodename}, {torch.get_num_threads()} thread, load "
          f"{os.getloadavg()[0]:.1f}, context bucket {args.context_bucket}, {args.tokens} "
          f"tokens", file=sys.stderr)
    print("| method | batch | eager, exact reads | eager | compiled | compiled / eager | "
          "warm-up s (eager, compiled) | graphs | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for method in args.methods.split(","):
            for b in (int(x) for x in args.batches.split(",")):
                row = {}
                for mode, bucket in (("exact", 0), ("none", args.context_bucket),
                                     (args.compile, args.context_bucket)):
                    engine = build_engine(target, drafter, max_batch=8, max_context=256,
                                          max_tree_nodes=64, compile=mode.replace("exact", "none"),
                                          context_bucket=bucket)
                    began = time.perf_counter()
                    run(engine, SPECS[method], held_out[:b], args.tokens)
                    warm_s = time.perf_counter() - began
                    step_s, rounds, out = run(engine, SPECS[method], held_out[:b], args.tokens)
                    graphs = engine.compiled.compiles if engine.compiled else 0
                    row[mode] = (step_s / rounds * 1e3, warm_s, graphs, out)
                exact, eager, comp = row["exact"], row["none"], row[args.compile]
                print(f"| {method} | {b} | {exact[0]:.2f} | {eager[0]:.2f} | {comp[0]:.2f} | "
                      f"{comp[0] / eager[0]:.2f} | {eager[1]:.1f}, {comp[1]:.1f} | {comp[2]} | "
                      f"{exact[3] == eager[3] == comp[3]} |", flush=True)


if __name__ == "__main__":
    main()
