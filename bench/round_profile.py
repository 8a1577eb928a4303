"""Per-stage profile of one decode round on the tiny pair: wall ms, ATen ops and host ms.

For plain decoding, DFlash block 8 and DDTree (block 8, budget 32, top-k 4) at batch 1 and 8,
on the pair's held-out prompts (greedy): the engine is built as `dflash-tune serve` builds it,
rows are admitted, a few rounds warm it up, then `dflash_core.runtime.profile.profile_rounds`
times `--rounds` rounds per stage and counts the ATen ops of as many more. Op counts are
deterministic; milliseconds move with the machine's load (report `uptime` beside them).

    python bench/round_profile.py [--rounds 10] [--batches 1,8] [--threads 1] [--compile inductor]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

from dflash_core import SamplingParams, Spec, build_engine, load_models
from dflash_core.runtime.profile import RoundProfile, profile_rounds
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


def table(results: dict[tuple[str, int], RoundProfile]) -> str:
    lines = ["| method | batch | stage | wall ms | ATen ops | in-op ms | host ms |",
             "|---|---|---|---|---|---|---|"]
    for (method, b), prof in results.items():
        for stage, s in [*prof.stages.items(), ("round total", prof.total)]:
            lines.append(f"| {method} | {b} | {stage} | {s.wall_ms:.2f} | {s.ops:.0f} | "
                         f"{s.op_ms:.2f} | {s.host_ms:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--methods", default="plain,dflash b8,ddtree b8 budget 32",
                        help=f"comma list of {list(SPECS)}")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--compile", default="none", help="EngineConfig.compile")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; on a shared 2-core machine 2 threads spin-wait "
                             "on each other and a round costs ~10x (measured)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = ensure_pair()
    target, drafter = load_models(pair / "target", pair / "drafter", args.dtype)
    batches = [int(x) for x in args.batches.split(",")]
    # Compiled, the rows round up to the profiled batches, so capture compiles only those.
    engine = build_engine(target, drafter, max_batch=8, max_context=256, max_tree_nodes=64,
                          compile=args.compile,
                          batch_buckets=tuple(batches) if args.compile != "none" else ())
    ids = prompts(pair, 8)
    results = {}
    with torch.inference_mode():
        for method in args.methods.split(","):
            for b in batches:
                results[method, b] = profile(engine, SPECS[method], b, args.rounds, ids)
    print(table(results))
    print(f"\n{platform.node()} {platform.machine()}, {torch.get_num_threads()} threads, "
          f"load {os.getloadavg()[0]:.1f}, {args.rounds} rounds timed + {args.rounds} counted, "
          f"{args.dtype}, compile={args.compile}", file=sys.stderr)
    for key, prof in results.items():
        print(f"{key}: top ops {[(s, o, round(n, 1)) for s, o, n in prof.top_ops[:6]]}",
              file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(
            {f"{m} b{b}": {s: {"wall_ms": p.wall_ms, "ops": p.ops, "op_ms": p.op_ms}
                           for s, p in prof.stages.items()} for (m, b), prof in results.items()},
            indent=2))


if __name__ == "__main__":
    main()
