"""The fixed cost of calling a torch.compile'd function on CPU, apart from what it computes.

Two measurements, 1 torch thread:
- a trivial function (x * 2 + y, relu, sum over 33 values): eager, through `torch.compile`
  (Dynamo's frame hook, guards, the AOT wrapper, Inductor's code), and the same Inductor code
  called directly, without Dynamo (`torch._inductor.standalone_compile` of its FX graph);
- `torch.profiler` over the tiny pair's compiled verify forward (`CompiledForward`, batch 1,
  one node, prefix read 64): the self time of Dynamo's cache lookup per call, next to the call.

    OMP_NUM_THREADS=1 python bench/compile_call_overhead.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from dflash_core import load_models
from dflash_core.models.step import Step
from dflash_core.runtime.compiled import CompiledForward
from dflash_core.training.pair import ensure_pair


def per_call_us(fn, *args, calls: int) -> float:
    for _ in range(50):
        fn(*args)
    blocks = []
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(calls // 5):
            fn(*args)
        blocks.append((time.perf_counter() - began) / (calls // 5) * 1e6)
    return statistics.median(blocks)


def trivial(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x * 2 + y).relu().sum(-1)


def trivial_rows(calls: int) -> list[str]:
    x, y = torch.randn(1, 33), torch.randn(1, 33)
    direct = torch._inductor.standalone_compile(torch.fx.symbolic_trace(trivial), [x, y],
                                                dynamic_shapes="from_example_inputs")
    compiled = torch.compile(trivial, dynamic=False)
    timed = {"eager": trivial, "torch.compile": compiled, "Inductor, no Dynamo": direct}
    return [f"trivial function, {name + ':':21s} {per_call_us(fn, x, y, calls=calls):6.1f} us"
            for name, fn in timed.items()]


def verify_rows() -> list[str]:
    pair = ensure_pair()
    target, drafter = load_models(pair / "target", pair / "drafter", "float32")
    taps = tuple(drafter.config.target_layer_ids)
    cache = target.allocate_cache(1, 320)
    compiled = CompiledForward(target, taps, "inductor")
    ids, starts = torch.tensor([[5]]), torch.tensor([64])
    mask = torch.ones(1, 1, 1, dtype=torch.bool)

    def call() -> None:
        compiled(ids, Step(starts[:, None], starts[:, None], starts, 64, mask), cache, taps)

    for _ in range(20):
        call()
    calls = 50
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            call()
    by_name = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    lookup = sum(v for k, v in by_name.items() if "Dynamo Cache Lookup" in k) / calls
    return [f"verify forward (b1, 1 node, read 64): {per_call_us(call, calls=300):6.1f} us a "
            f"call, of which Dynamo's cache lookup {lookup:.1f} us (profiled)"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with torch.inference_mode():
        rows = trivial_rows(args.calls) + verify_rows()
    print("\n".join(rows))
    print(f"{os.uname().nodename}, 1 thread, load {os.getloadavg()[0]:.1f}, torch "
          f"{torch.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
