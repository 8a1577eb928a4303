"""Per-stage profile of one decode round on the tiny pair: wall ms, ATen ops and host ms.

For plain decoding, DFlash block 8 and DDTree (block 8, budget 32, top-k 4) at batch 1 and 8,
on the pair's held-out prompts (greedy): each method gets an engine of its own, built as
`dflash-tune serve` builds it (so no method runs another's compiled graphs), rows are
admitted, a few rounds warm it up, then `dflash_core.runtime.profile.profile_rounds` times
`--rounds` rounds per stage and counts the ATen ops of as many more. With `--repeats R` the
methods take turns R times (each at every batch, the order rotated and reversed between
repeats: `harness.turn_order`) and the table gives each stage's median over the repeats, plus
each method's round time over the first method's at the same batch (the median of the
per-repeat ratios): on a machine whose speed drifts, only ratios measured in turns mean
anything. Op counts are deterministic.

    python bench/round_profile.py [--rounds 10] [--batches 1,8] [--repeats 1] [--threads 1]
        [--compile inductor] [--json OUT]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from harness import arguments, host_line, save_json, stat, table, turn_ratios, turns

from dflash_core import SamplingParams, Spec, build_engine, load_models
from dflash_core.runtime.profile import RoundProfile, StageProfile, profile_rounds
from dflash_core.training.pair import ensure_pair

SPECS = {
    "plain": Spec.none(),
    "dflash b8": Spec.of("dflash", 8),
    "ddtree b8 budget 7": Spec.of("ddtree", 8, budget=7, topk=4),
    "ddtree b8 budget 16": Spec.of("ddtree", 8, budget=16, topk=4),
    "ddtree b8 budget 32": Spec.of("ddtree", 8, budget=32, topk=4),
}
WARMUP = 3


def prompts(pair: Path, count: int) -> list[list[int]]:
    return [p[:64] for p in json.loads((pair / "heldout_prompts.json").read_text())[:count]]


def profile(engine, spec: Spec, batch_size: int, rounds: int, ids: list[list[int]]) -> RoundProfile:
    batch = engine.open_batch(spec, batch_size)
    if engine.config.fixed_shapes:  # every shape compiled first, so no round times a compile
        batch.capture()
    # Enough tokens for warm-up + timed + counted rounds even if every round accepts the block.
    sampling = SamplingParams(max_tokens=(WARMUP + 2 * rounds) * spec.num_nodes + 8)
    batch.admit(ids[:batch_size], [sampling] * batch_size)
    for _ in range(WARMUP):
        batch.step()
    return profile_rounds(batch, rounds)


def median_profile(runs: list[RoundProfile]) -> RoundProfile:
    """Each stage's median wall and op time over repeated profiles (op counts do not vary)."""
    median = RoundProfile(runs[0].rounds, top_ops=runs[0].top_ops)
    for stage, first in runs[0].stages.items():
        parts = [r.stages[stage] for r in runs if stage in r.stages]
        median.stages[stage] = StageProfile(stat([p.wall_ms for p in parts]).median,
                                            first.ops, stat([p.op_ms for p in parts]).median)
    return median


def stages(medians: dict[tuple[str, int], RoundProfile]) -> str:
    rows = [[method, b, stage, f"{s.wall_ms:.2f}", f"{s.ops:.0f}", f"{s.op_ms:.2f}",
             f"{s.host_ms:.2f}"]
            for (method, b), prof in medians.items()
            for stage, s in [*prof.stages.items(), ("round total", prof.total)]]
    return table(["method", "batch", "stage", "wall ms", "ATen ops", "in-op ms", "host ms"], rows)


def ratios(results: dict[tuple[str, int], list[RoundProfile]], methods: list[str]) -> str:
    """Round wall time over the first method's at the same batch: the median of the per-repeat
    ratios, with their range."""
    rows = [[method, b, turn_ratios([r.total.wall_ms for r in runs],
                                    [f.total.wall_ms for f in results[methods[0], b]]
                                    ).range_cell()]
            for (method, b), runs in results.items()]
    return table(["method", "batch", f"round ms / {methods[0]}'s (per-repeat range)"], rows)


def main() -> None:
    parser = arguments(__doc__, repeats=1)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--methods", default="plain,dflash b8,ddtree b8 budget 32",
                        help=f"comma list of {list(SPECS)}")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--compile", default="none", help="EngineConfig.compile")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; on a shared 2-core machine 2 threads spin-wait "
                             "on each other and a round costs ~10x (measured)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = ensure_pair()
    target, drafter = load_models(pair / "target", pair / "drafter", args.dtype)
    batches = [int(x) for x in args.batches.split(",")]
    methods = args.methods.split(",")
    # One engine per method: its own cache and compiled graphs. Compiled, the rows round up to
    # the profiled batches, so capture compiles only those.
    engines = {m: build_engine(target, drafter, max_batch=max(batches), max_context=256,
                               max_tree_nodes=64, compile=args.compile,
                               batch_buckets=tuple(batches) if args.compile != "none" else ())
               for m in methods}
    ids = prompts(pair, max(batches))
    results: dict[tuple[str, int], list[RoundProfile]] = {(m, b): [] for m in methods
                                                          for b in batches}
    with torch.inference_mode():
        for _, method in turns(methods, args.repeats):
            for b in batches:
                results[method, b].append(
                    profile(engines[method], SPECS[method], b, args.rounds, ids))
    medians = {key: median_profile(runs) for key, runs in results.items()}
    print(stages(medians))
    if len(methods) > 1:
        print()
        print(ratios(results, methods))
    print(f"\n{args.repeats} repeats x {args.rounds} rounds timed + {args.rounds} counted, "
          f"{args.dtype}, compile={args.compile}; {host_line()}", file=sys.stderr)
    for key, prof in medians.items():
        print(f"{key}: top ops {[(s, o, round(n, 1)) for s, o, n in prof.top_ops[:6]]}",
              file=sys.stderr)
    save_json(args.json, {"args": vars(args), "profiles": {
        f"{m} b{b}": {s: {"wall_ms": p.wall_ms, "ops": p.ops, "op_ms": p.op_ms}
                      for s, p in prof.stages.items()} for (m, b), prof in medians.items()}})


if __name__ == "__main__":
    main()
