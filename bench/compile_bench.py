"""Eager vs `--compile inductor` per decode round on the tiny pair: ms per round, warm-up, tokens.

For each method and batch, three engines: eager with exact reads (the default), eager and
compiled with the same context bucket (so both read the same padded prefix). Each runs the
batch once as its warm-up (it pays every compile; its seconds and the compiled graphs are
reported), then the three run it `--repeats` more times in turn, timed, steps only (prefill is
not timed); medians are reported, and the tokens of the three are compared.

    OMP_NUM_THREADS=1 python bench/compile_bench.py [--methods plain,dflash] [--batches 1,8] \
        [--context-bucket 64] [--tokens 48] [--compile inductor] [--repeats 5] [--dtype bfloat16] \
        [--json OUT]
"""

from __future__ import annotations

import json
import sys

import torch
from harness import Timer, arguments, host_line, save_json, stat, table, turns

from dflash_core import SamplingParams, Spec, build_engine, load_models
from dflash_core.training.pair import ensure_pair

SPECS = {"plain": Spec.none(), "dflash": Spec.of("dflash", 8),
         "ddtree": Spec.of("ddtree", 8, budget=15, topk=4)}
HEADER = ["method", "batch", "eager, exact reads", "eager", "compiled", "compiled / eager",
          "warm-up s (eager, compiled)", "graphs", "same tokens"]


def run(engine, spec: Spec, prompts: list[list[int]], tokens: int) -> tuple[float, int, list]:
    """-> (seconds in steps, rounds, tokens per row) of one batch to the end."""
    batch = engine.open_batch(spec, len(prompts))
    batch.admit(prompts, [SamplingParams(max_tokens=tokens)] * len(prompts))
    step_s = 0.0
    while batch.live_rows():
        timer = Timer()
        batch.step()
        step_s += timer.s
    return step_s, batch.stats.rounds, [r.output for r in batch.requests]


def row(target, drafter, spec: Spec, prompts: list[list[int]], args, method: str) -> dict:
    """One table row: three engines warmed up, then `repeats` timed runs of each in turns (on a
    shared machine alternating spreads load swings over all three; medians reported)."""
    modes = {"exact": ("none", 0), "eager": ("none", args.context_bucket),
             "compiled": (args.compile, args.context_bucket)}
    engines, warm_s = {}, {}
    for name, (mode, bucket) in modes.items():
        engines[name] = build_engine(target, drafter, max_batch=8, max_context=256,
                                     max_tree_nodes=64, compile=mode, context_bucket=bucket)
        timer = Timer()
        run(engines[name], spec, prompts, args.tokens)
        warm_s[name] = round(timer.s, 1)
    ms, tokens = {name: [] for name in modes}, {}
    for _, name in turns(list(modes), args.repeats):
        step_s, rounds, tokens[name] = run(engines[name], spec, prompts, args.tokens)
        ms[name].append(step_s / rounds * 1e3)
    exact, eager, comp = (stat(ms[name]).median for name in modes)
    return {"method": method, "batch": len(prompts), "exact_ms": round(exact, 2),
            "eager_ms": round(eager, 2), "compiled_ms": round(comp, 2),
            "compiled_over_eager": round(comp / eager, 2), "warm_s": warm_s,
            "graphs": sum(g.compiles for g in engines["compiled"].compiled_graphs()),
            "same_tokens": tokens["exact"] == tokens["eager"] == tokens["compiled"]}


def main() -> None:
    parser = arguments(__doc__, repeats=5)
    parser.add_argument("--methods", default="plain,dflash")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--context-bucket", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--compile", default="inductor")
    parser.add_argument("--dtype", default="float32", help="the engines' dtype (vLLM: bf16)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = ensure_pair()
    target, drafter = load_models(pair / "target", pair / "drafter", args.dtype)
    held_out = [p[:64] for p in json.loads((pair / "heldout_prompts.json").read_text())[:8]]
    with torch.inference_mode():
        rows = [row(target, drafter, SPECS[method], held_out[:b], args, method)
                for method in args.methods.split(",")
                for b in (int(x) for x in args.batches.split(","))]
    print(table(HEADER, [[r["method"], r["batch"], r["exact_ms"], r["eager_ms"],
                          r["compiled_ms"], r["compiled_over_eager"],
                          f"{r['warm_s']['eager']}, {r['warm_s']['compiled']}", r["graphs"],
                          r["same_tokens"]] for r in rows]))
    print(f"\n{args.dtype}, context bucket {args.context_bucket}, {args.tokens} tokens, "
          f"medians of {args.repeats} repeats; {host_line()}", file=sys.stderr)
    save_json(args.json, {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
