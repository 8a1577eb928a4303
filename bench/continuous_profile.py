"""Where a continuously batched engine's time goes at a fixed concurrency: prefill vs rounds.

The serving loop's work without HTTP: `--concurrency` rows kept busy from a queue of the tiny
pair's held-out prompts (64 in / `--tokens` out, greedy), as `dflash-tune serve`'s engine loop
does: finished rows are released and refilled (one admission, one prefill, per new request)
between rounds. Reported: output tok/s (median of repeats, spread = range / median), the share
of wall time in admissions (prefill), and the rounds of one run. Every (dtype, compile)
configuration gets an engine, shared by the methods (a comma list); with compile on every
shape is compiled first (`LiveBatch.capture`), as the server does before it listens; the
methods, configurations and concurrencies then run in turns, so a slow minute of the machine
falls on all of them.

    OMP_NUM_THREADS=1 python bench/continuous_profile.py [--method dflash,ddtree16] \
        [--concurrency 1,8] [--requests 32] [--tokens 64] [--dtype float32,bfloat16] \
        [--compile none,inductor] [--context-bucket 64] [--repeats 3] [--json OUT]
"""

from __future__ import annotations

import sys

import torch
from harness import Timer, arguments, host_line, save_json, stat, table, turns

from dflash_core import SamplingParams, Spec, build_engine, load_models
from dflash_core.training.evaluate import held_out_prompts
from dflash_core.training.pair import ensure_pair

SPECS = {"plain": Spec.none(), "dflash": Spec.of("dflash", 8),
         "ddtree7": Spec.of("ddtree", 8, budget=7, topk=4),
         "ddtree15": Spec.of("ddtree", 8, budget=15, topk=4),
         "ddtree16": Spec.of("ddtree", 8, budget=16, topk=4),
         "ddtree16r64": Spec.of("ddtree", 8, budget=16, topk=4, round_tokens=64)}


def serve_queue(batch, prompts: list[list[int]], tokens: int) -> dict:
    """Run every prompt through `batch`, refilling free rows between rounds -> the seconds in
    admissions and in rounds, the tokens generated and the rounds run."""
    sampling = SamplingParams(max_tokens=tokens)
    queue, admit_s, round_s, generated, rounds = list(prompts), 0.0, 0.0, 0, 0
    while queue or batch.live_rows():
        free = [b for b in batch.free_rows() if batch.requests[b] is not None]
        for row in free:
            generated += len(batch.requests[row].output)
            batch.release(row)
        room = min(len(batch.free_rows()), len(queue))
        if room:
            timer = Timer()
            batch.admit(queue[:room], [sampling] * room)
            admit_s += timer.s
            del queue[:room]
        timer = Timer()
        batch.step()
        round_s += timer.s
        rounds += 1
    generated += sum(len(r.output) for r in batch.requests if r is not None)
    return {"admit_s": admit_s, "round_s": round_s, "tokens": generated, "rounds": rounds}


def configurations(args) -> list[tuple[str, str]]:
    return [(d, c) for d in args.dtype.split(",") for c in args.compile.split(",")]


def open_batches(pair, specs: dict[str, Spec], args, concurrencies: list[int]) -> dict:
    """(method, dtype, compile, concurrency) -> a live batch with every shape compiled
    (capture); one engine per (dtype, compile), shared by the methods."""
    batches = {}
    needs_drafter = any(spec.method != "none" for spec in specs.values())
    for dtype, mode in configurations(args):
        target, drafter = load_models(pair / "target", pair / "drafter", dtype)
        buckets = tuple(b for b in (1, 2, 4, 8) if b <= max(concurrencies))
        engine = build_engine(target, drafter if needs_drafter else None,
                              max_batch=max(concurrencies), max_context=256,
                              max_tree_nodes=max(s.num_nodes for s in specs.values()),
                              batch_buckets=buckets, compile=mode,
                              context_bucket=args.context_bucket)
        timer, made = Timer(), 0
        for method, spec in specs.items():
            for c in sorted(concurrencies, reverse=True):
                batch = batches[method, dtype, mode, c] = engine.open_batch(spec, c)
                made += batch.capture() if engine.config.fixed_shapes else 0
        if engine.config.fixed_shapes:
            print(f"{dtype} {mode}: compiled {made} graphs in "
                  f"{timer.s:.0f} s", file=sys.stderr)
    return batches


def main() -> None:
    parser = arguments(__doc__, repeats=3)
    parser.add_argument("--method", default="dflash", help=f"comma list of {sorted(SPECS)}")
    parser.add_argument("--concurrency", default="8", help="comma list")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--compile", default="none", help="comma list (EngineConfig.compile)")
    parser.add_argument("--dtype", default="float32",
                        help="comma list of the engines' dtypes (vLLM: bf16)")
    parser.add_argument("--context-bucket", type=int, default=0,
                        help="EngineConfig.context_bucket (0: exact reads, 256 with compile)")
    args = parser.parse_args()
    pair = ensure_pair()
    unknown = sorted(set(args.method.split(",")) - set(SPECS))
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose from {sorted(SPECS)}")
    specs = {m: SPECS[m] for m in args.method.split(",")}
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    prompts = [p[:64] for p in held_out_prompts(pair)][:args.requests]
    runs = {}
    with torch.inference_mode():
        batches = open_batches(pair, specs, args, concurrencies)
        for batch in batches.values():
            serve_queue(batch, prompts[:batch.cache.rows], 8)  # first calls, prefill
        # In turns, so a slow minute of a shared machine falls on every configuration.
        for _, key in turns(list(batches), args.repeats):
            runs.setdefault(key, []).append(serve_queue(batches[key], prompts, args.tokens))
    rows = [summary(key, results) for key, results in runs.items()]
    print(table(["method", "dtype", "compile", "conc.", "tok/s median (spread)",
                 "admissions share", "rounds"],
                [[r["method"], r["dtype"], r["compile"], r["concurrency"], r["tok_s"].cell(),
                  f"{r['admit_share']:.0%}", r["rounds"]] for r in rows]))
    print(f"\n{args.repeats} repeats x {args.requests} requests x {args.tokens} tokens; "
          f"{host_line()}", file=sys.stderr)
    save_json(args.json, {"args": vars(args), "rows": [
        r | {"tok_s": round(r["tok_s"].median, 1), "admit_share": round(r["admit_share"], 3),
             "tok_s_runs": [round(t, 1) for t in r["tok_s"].runs]} for r in rows]})


def summary(key: tuple, results: list[dict]) -> dict:
    """One row: tok/s over the repeats, the median share of wall time in admissions."""
    method, dtype, mode, c = key
    rates = stat([r["tokens"] / (r["admit_s"] + r["round_s"]) for r in results])
    share = stat([r["admit_s"] / (r["admit_s"] + r["round_s"]) for r in results]).median
    return {"method": method, "dtype": dtype, "compile": mode, "concurrency": c, "tok_s": rates,
            "admit_share": share, "rounds": results[-1]["rounds"]}


if __name__ == "__main__":
    main()
