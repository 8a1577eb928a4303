"""The facts the performance model needs of a CPU host, measured on this machine: streaming
memory bandwidth and dense GEMM throughput in the engine's dtypes, with the thread count the
engine uses. They are the CPU's "datasheet" in backends/perf_model/hardware.yaml (a VM has no
published one); the fitted efficiencies then say how much of them the engine reaches.

    python bench/cpu_host_facts.py [--threads 2] [--gib 0.5] [--repeats 5] [--json OUT]

Each figure is the best (fastest) of `--repeats` runs after a warm-up: the hardware's
capability, not a typical run.
"""

from __future__ import annotations

import sys

import torch
from harness import arguments, host_line, samples, save_json


def best_of(fn, repeats: int) -> float:
    return min(samples(fn, repeats))


def main() -> None:
    parser = arguments(__doc__, repeats=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gib", type=float, default=0.5, help="size of the streamed tensor")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    a = torch.empty(int(args.gib * 2**30 / 4), dtype=torch.float32).uniform_()
    read = a.numel() * 4 / best_of(a.sum, args.repeats) / 1e9
    b = torch.empty_like(a)
    copy = 2 * a.numel() * 4 / best_of(lambda: b.copy_(a), args.repeats) / 1e9
    print(f"threads {args.threads}: read {read:.1f} GB/s, copy (read + write) {copy:.1f} GB/s")
    n, gemm = 1024, {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        name = str(dtype).removeprefix("torch.")
        gemm[name] = 2 * n**3 / best_of(lambda: x @ y, args.repeats) / 1e9
        print(f"  {name:>8} {n}x{n} GEMM: {gemm[name]:,.0f} GFLOP/s")
    print(host_line(), file=sys.stderr)
    save_json(args.json, {"threads": args.threads, "read_gb_s": round(read, 2),
                          "copy_gb_s": round(copy, 2),
                          "gemm_gflop_s": {k: round(v, 1) for k, v in gemm.items()}})


if __name__ == "__main__":
    main()
