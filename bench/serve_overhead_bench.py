"""HTTP serving overhead: `dflash-tune serve` vs the in-process engine on the tiny pair.

All run the same engine configuration on the same prompts at the same concurrency; the serve
sides go through a real server, the async load generator and streaming HTTP: "serve" as shipped
(the engine in its own process, the HTTP front end in another) and "serve thread" with
`--engine-thread` (both in one process). Repeats alternate the
three so drift hits all; medians are reported, the ratios as medians of per-repeat ratios. CPU
only (where this project's CI runs), so absolute tok/s say little; the ratio is the point
(target: serve >= 85% of in-process at concurrency 8).

    python bench/serve_overhead_bench.py [--repeats 3] [--concurrency 8] [--configs plain,...]
        [--json OUT]
"""

from __future__ import annotations

import sys

from harness import Timer, arguments, host_line, save_json, stat, table, turn_ratios, turns

from backends import Deployment, LaunchParams, Workload, get_backend
from backends.flags import LaunchTarget
from backends.serving import DFlashServeBackend
from dflash_core.training.pair import ensure_pair

CONFIGS = {
    "plain": {"tp_size": 1, "cuda_graph": False, "max_running_requests": 8},
    "dflash b8": {"tp_size": 1, "cuda_graph": False, "max_running_requests": 8,
                  "speculative_algorithm": "dflash"},
    "ddtree b8 budget 16": {"tp_size": 1, "cuda_graph": False, "max_running_requests": 8,
                            "speculative_algorithm": "ddtree", "speculative_ddtree_budget": 16,
                            "speculative_ddtree_topk": 4},
}


def deployment() -> Deployment:
    pair = ensure_pair()
    target = LaunchTarget(str(pair / "target"), str(pair / "drafter"), context_length=256)
    return Deployment(gpu="cpu", gpus=1, model=str(pair / "target" / "config.json"),
                      target=target, engine="dflash")


class ThreadServeBackend(DFlashServeBackend):
    """`dflash-tune serve --engine-thread`: the engine loop a thread of the HTTP process."""

    def executable(self, argv: list[str]) -> list[str]:
        return [*super().executable(argv), "--engine-thread"]


def run(repeats: int, concurrency: int, requests: int, configs: list[str]) -> list[dict]:
    dep = deployment()
    backends = {"inprocess": get_backend("inprocess", dep, requests_per_level=requests),
                "serve": get_backend("serve", dep, requests_per_level=requests),
                "serve thread": ThreadServeBackend(dep, requests_per_level=requests)}
    workload = Workload(input_len=64, output_len=64, concurrency=(concurrency,))
    rows = []
    for name in configs:
        params = CONFIGS[name]
        tok_s: dict[str, list[float]] = {kind: [] for kind in backends}
        accept: dict[str, list[float]] = {kind: [] for kind in backends}
        for _, kind in turns(list(backends), repeats):
            (m,) = backends[kind].measure(LaunchParams(**params), workload)
            assert m.ok, m.log_excerpt
            tok_s[kind].append(m.output_tok_s)
            accept[kind].append(m.accept_len_mean or 1.0)
        rows.append(summary(name, tok_s, accept))
    return rows


def summary(name: str, tok_s: dict[str, list[float]], accept: dict[str, list[float]]) -> dict:
    """One config's row: median tok/s of each side, and serve / in-process as the median of
    the per-repeat ratios (with those ratios)."""
    inproc, serve, thread = (stat(tok_s[k]).median for k in ("inprocess", "serve", "serve thread"))
    ratio = turn_ratios(tok_s["serve"], tok_s["inprocess"])
    thread_ratio = turn_ratios(tok_s["serve thread"], tok_s["inprocess"])
    return {"config": name, "inprocess_tok_s": round(inproc, 1),
            "serve_tok_s": round(serve, 1), "ratio": round(ratio.median, 3),
            "thread_tok_s": round(thread, 1), "thread_ratio": round(thread_ratio.median, 3),
            "accept_inprocess": round(stat(accept["inprocess"]).median, 2),
            "accept_serve": round(stat(accept["serve"]).median, 2),
            "ratios_each_repeat": [round(r, 3) for r in ratio.runs],
            "thread_ratios_each_repeat": [round(r, 3) for r in thread_ratio.runs]}


def markdown(rows: list[dict], concurrency: int) -> str:
    return table([f"config (concurrency {concurrency})", "in-process tok/s", "serve tok/s",
                  "serve / in-process", "serve thread tok/s", "thread / in-process",
                  "tau in-process", "tau serve", "ratio per repeat (serve; thread)"],
                 [[r["config"], r["inprocess_tok_s"], r["serve_tok_s"], r["ratio"],
                   r["thread_tok_s"], r["thread_ratio"], r["accept_inprocess"],
                   r["accept_serve"],
                   f"{r['ratios_each_repeat']}; {r['thread_ratios_each_repeat']}"]
                  for r in rows])


def main() -> None:
    parser = arguments(__doc__, repeats=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    args = parser.parse_args()
    timer = Timer()
    rows = run(args.repeats, args.concurrency, args.requests, args.configs.split(","))
    print(markdown(rows, args.concurrency))
    print(f"\n{args.requests} requests x 64 in / 64 out tokens per measurement, medians of "
          f"{args.repeats} alternating repeats, {timer.s:.0f} s; at the end {host_line()}",
          file=sys.stderr)
    save_json(args.json, {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
