"""The facts the performance model needs of a CPU host, measured on this machine: streaming
memory bandwidth and dense GEMM throughput in the engine's dtypes, with the thread count the
engine uses. They are the CPU's "datasheet" in backends/perf_model/hardware.yaml (a VM has no
published one); the fitted efficiencies then say how much of them the engine reaches.

    python bench/cpu_host_facts.py [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch


def best_of(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - began)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gib", type=float, default=0.5, help="size of the streamed tensor")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    a = torch.empty(int(args.gib * 2**30 / 4), dtype=torch.float32).uniform_()
    read = a.numel() * 4 / best_of(a.sum) / 1e9
    b = torch.empty_like(a)
    copy = 2 * a.numel() * 4 / best_of(lambda: b.copy_(a)) / 1e9
    print(f"threads {args.threads}: read {read:.1f} GB/s, copy (read + write) {copy:.1f} GB/s")
    n = 1024
    for dtype in (torch.float32, torch.bfloat16):
        x, y = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        flops = 2 * n**3 / best_of(lambda: x @ y) / 1e9
        print(f"  {str(dtype).removeprefix('torch.'):>8} {n}x{n} GEMM: {flops:,.0f} GFLOP/s")


if __name__ == "__main__":
    main()
