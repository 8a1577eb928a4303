"""Collectives per decode round of dflash_core over CPU ranks (gloo), per layout and method.

On CPU the times say nothing about PCIe or NVLink; the counts and bytes do, and they are what a
GPU run sends too (at 2 bytes an element in bf16 instead of 4 here). For each layout (TP2,
TP2+EP2 and TP4+EP2 on a random Qwen3-MoE; TP2 on the shipped dense pair; TP2 and TP2+EP2 on
the random Kimi-shaped DeepSeek target: MLA, INT4 experts) and each method
(plain, DFlash, DDTree budget 32) it runs a batch of 4 requests and reports, per round and per
rank: all-reduces, all-gathers and broadcasts with their bytes, the verify tokens, and the
milliseconds a round took here. It also checks that every run gave the single-device plain
greedy tokens, and states what a tensor-parallel drafter would have added (the drafter is
replicated).

    python bench/parallel_traffic_bench.py [--max-tokens 24] [--seed 0] [--json OUT]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from harness import Timer, arguments, host_line, save_json, table

from dflash_core import SamplingParams, Spec, build_engine, load_models
from dflash_core.models.random_checkpoint import write_random_pair
from dflash_core.parallel.layout import Layout
from dflash_core.parallel.ranks import EngineRecipe, Ranks

SHIPPED = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_code"
PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 10], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [30]]
LAYOUTS = [("dense (shipped pair)", 2, 1), ("MoE (random)", 2, 1), ("MoE (random)", 2, 2),
           ("MoE (random)", 4, 2), ("MLA + INT4 MoE (random Kimi-shaped)", 2, 1),
           ("MLA + INT4 MoE (random Kimi-shaped)", 2, 2)]


def methods(block: int) -> list[Spec]:
    return [Spec.none(), Spec.dflash(block), Spec.ddtree(block, 32, topk=4)]


def run_layout(pair: tuple[Path, Path], tp: int, ep: int, max_tokens: int) -> list[dict]:
    target, drafter = load_models(*pair)
    block = drafter.config.block_size
    engine = dict(max_batch=len(PROMPTS), max_context=96, max_tree_nodes=33)
    sampling = SamplingParams(max_tokens=max_tokens)
    with torch.inference_mode():
        plain = build_engine(target, drafter, **engine).generate(PROMPTS, sampling).tokens
    ranks = Ranks(EngineRecipe(pair[0], pair[1], Layout(tp, ep), engine=engine,
                               threads=max(1, torch.get_num_threads() // tp)))
    rows = []
    try:
        for spec in methods(block):
            with torch.inference_mode():
                ranks.engine.generate(PROMPTS, sampling, spec)  # warm-up
                timer = Timer()
                run = ranks.engine.generate(PROMPTS, sampling, spec)
            stats = run.stats
            rows.append(dict(tp=tp, ep=ep, method=spec.method, verify_tokens=spec.num_nodes,
                             rounds=stats.rounds, lossless=run.tokens == plain,
                             round_ms=timer.s / stats.rounds * 1e3,
                             tau=stats.mean_acceptance,
                             per_round=stats.comm.per_round(stats.rounds),
                             tp_drafter_extra=_tp_drafter_all_reduces(drafter, spec)))
    finally:
        ranks.close()
    return rows


def _tp_drafter_all_reduces(drafter, spec: Spec) -> int:
    """All-reduces a tensor-parallel drafter would add per round (after attention and MLP in
    each of its layers): what replicating it saves."""
    return 0 if spec.method == "none" else 2 * drafter.config.layers.num_hidden_layers


def main() -> None:
    parser = arguments(__doc__, seed=0)
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="traffic-bench-") as tmp:  # the random pairs
        folder = Path(tmp)
        pairs = {"dense": (SHIPPED / "target", SHIPPED / "drafter"),
                 "MoE": write_random_pair("qwen3-moe", folder / "moe", seed=args.seed),
                 "MLA": write_random_pair("deepseek-v3", folder / "mla", seed=args.seed)}
        rows = []
        for name, tp, ep in LAYOUTS:
            pair = pairs[name.split()[0]]
            rows += [dict(model=name, **row)
                     for row in run_layout(pair, tp, ep, args.max_tokens)]
    print(f"batch {len(PROMPTS)}, {args.max_tokens} tokens")
    print(table(["model", "layout", "method", "verify tokens/req", "tau",
                 "all-reduce /round (KiB)", "all-gather /round (KiB)", "broadcast /round (B)",
                 "TP drafter would add", "round ms (CPU)", "lossless"], [cells(r) for r in rows]))
    print(host_line(), file=sys.stderr)
    save_json(args.json, {"rows": rows})


def cells(r: dict) -> list:
    """One table row: per-round collectives as `count (KiB)`."""
    pr = r["per_round"]
    traffic = {k: (f"{pr[k][0]:.1f} ({pr[k][1] / 1024:.1f})" if k in pr else "0")
               for k in ("all_reduce", "all_gather")}
    layout = f"TP{r['tp']}" + (f"+EP{r['ep']}" if r["ep"] > 1 else "")
    return [r["model"], layout, r["method"], r["verify_tokens"], f"{r['tau']:.2f}",
            traffic["all_reduce"], traffic["all_gather"],
            f"{pr.get('broadcast', (0, 0))[1]:.0f}", f"{r['tp_drafter_extra']} all-reduces",
            f"{r['round_ms']:.1f}", r["lossless"]]


if __name__ == "__main__":
    main()
