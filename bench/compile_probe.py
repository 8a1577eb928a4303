"""Why the compiled verify forward does (not) beat eager on CPU: one forward at one fixed shape.

Times the tiny pair's verify forward (the part `EngineConfig.compile` compiles) at fixed
(rows, nodes, prefix read) shapes, eager and through torch.compile in several variants, so a
difference is the compiler's and not the round's:

- `eager`: the Target called as the round calls it.
- `dynamic`: `torch.compile(dynamic=True)` of (ids, step, cache), what `--compile inductor` did
  until issue 18's fourth pass.
- `static`: the same closure with `dynamic=False` (one graph per shape).
- `pure`: `dynamic=False` over plain tensors; the Step and the KVCache are made inside the
  graph, so their per-forward memos (biases, layer views) are no side effects to replay.
- `engine`: `runtime.compiled.CompiledForward`, what `--compile inductor` does now: `pure`, but
  the cache writes run eagerly after the graph (in the graph they copy the whole cache).
- `freeze`: `engine` with `torch._inductor.config.freezing` (weights folded in as constants and
  prepacked for oneDNN on CPU).
- `cppwrap`: `engine` with `torch._inductor.config.cpp_wrapper`: the code that calls the
  generated kernels is C++ too, not Python.
- `noguard`: `engine` called under `torch.compiler.set_stance(skip_guard_eval_unsafe=True)`:
  Dynamo skips re-checking its guards (which tensors, which shapes, which parameters) on every
  call. Safe here only because each shape has a graph (a code object) of its own.

    OMP_NUM_THREADS=1 python bench/compile_probe.py --variants eager,static --batches 1,8 \
        [--nodes 1] [--read-len 64] [--calls 300] [--explain]

Prints one line per (variant, batch): compile seconds (first call), median us per forward
over blocks of calls, and whether the output equals eager's bit for bit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from dflash_core import load_models
from dflash_core.models.kv_cache import KVCache
from dflash_core.models.step import Step
from dflash_core.runtime.compiled import CompiledForward
from dflash_core.training.pair import ensure_pair

CAPACITY = 320  # the engine's max_context 256 + max_tree_nodes 64


def inputs(batch: int, nodes: int, read_len: int) -> tuple:
    """What Round._verify hands the forward for a chain of `nodes` (1: plain decoding)."""
    gen = torch.Generator().manual_seed(batch * 1000 + nodes)
    starts = torch.randint(max(read_len - 24, 1), read_len + 1, (batch,), generator=gen)
    starts[0] = read_len  # the longest row sets the read
    ids = torch.randint(2, 2048, (batch, nodes), generator=gen)
    offsets = torch.arange(nodes)
    positions = starts[:, None] + offsets
    mask = torch.ones(nodes, nodes, dtype=torch.bool).tril().expand(batch, nodes, nodes)
    return ids, positions, starts, mask


def variant_fn(name: str, target, taps: tuple[int, ...], read_len: int):
    """-> fn(ids, positions, starts, mask, cache) -> (hidden, features)."""
    def through_step(ids, positions, starts, mask, cache):
        return target(ids, Step(positions, positions, starts, read_len, mask), cache, taps)

    if name == "eager":
        return through_step
    if name in ("engine", "freeze", "cppwrap", "noguard"):
        compiled = CompiledForward(target, taps, "inductor")

        def engine(ids, positions, starts, mask, cache):
            return compiled(ids, Step(positions, positions, starts, read_len, mask), cache, taps)
        if name != "noguard":
            return engine
        stance = torch.compiler.set_stance
        return lambda *args: (stance(skip_guard_eval_unsafe=True)(engine)(*args)
                              if compiled.shapes.compiles else engine(*args))
    if name in ("dynamic", "static"):
        def closure(ids, step, cache):
            return target(ids, step, cache, taps)
        compiled = torch.compile(closure, dynamic=name == "dynamic")
        return lambda ids, positions, starts, mask, cache: compiled(
            ids, Step(positions, positions, starts, read_len, mask), cache)

    def pure(ids, positions, starts, mask, k, v):
        step = Step(positions, positions, starts, read_len, mask)
        return target(ids, step, KVCache(k, v), taps)
    compiled = torch.compile(pure, dynamic=False)
    return lambda ids, positions, starts, mask, cache: compiled(
        ids, positions, starts, mask, cache.k, cache.v)


def measure(fn, args: tuple, cache_of, calls: int) -> tuple[float, float, tuple]:
    began = time.perf_counter()
    out = fn(*args, cache_of())
    first_s = time.perf_counter() - began
    for _ in range(5):
        fn(*args, cache_of())
    blocks = []
    per_block = max(calls // 10, 1)
    for _ in range(10):
        t = time.perf_counter()
        for _ in range(per_block):
            fn(*args, cache_of())
        blocks.append((time.perf_counter() - t) / per_block * 1e6)
    return first_s, statistics.median(blocks), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="eager,dynamic,static,pure")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--read-len", type=int, default=64)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--explain", action="store_true",
                        help="torch._dynamo.explain of the static closure per batch (no Inductor)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = ensure_pair()
    target, drafter = load_models(pair / "target", pair / "drafter", "float32")
    taps = tuple(drafter.config.target_layer_ids)
    base = target.allocate_cache(8, CAPACITY)
    torch.manual_seed(0)
    base.k.normal_()
    base.v.normal_()
    print(f"{os.uname().nodename}, 1 thread, load {os.getloadavg()[0]:.1f}, torch "
          f"{torch.__version__}, nodes {args.nodes}, read {args.read_len}", file=sys.stderr)
    with torch.inference_mode():
        for batch in (int(b) for b in args.batches.split(",")):
            ids, positions, starts, mask = inputs(batch, args.nodes, args.read_len)
            # Every forward writes its nodes' K/V; restoring keeps calls alike and comparable.
            pristine_k, pristine_v = base.k.clone(), base.v.clone()

            def cache_of(batch=batch):
                return base.row_range(batch)
            if args.explain:
                step = Step(positions, positions, starts, args.read_len, mask)
                report = torch._dynamo.explain(lambda i, s, c: target(i, s, c, taps))(
                    ids, step, cache_of())
                print(f"explain b{batch}: graphs {report.graph_count}, breaks "
                      f"{report.graph_break_count}, ops {report.op_count}, "
                      f"reasons {[r.reason for r in report.break_reasons]}", file=sys.stderr)
                torch._dynamo.reset()
            reference = None
            for name in args.variants.split(","):
                torch._dynamo.reset()
                torch._inductor.config.freezing = name == "freeze"
                torch._inductor.config.cpp_wrapper = name == "cppwrap"
                base.k.copy_(pristine_k)
                base.v.copy_(pristine_v)
                fn = variant_fn(name, target, taps, args.read_len)
                first_s, us, out = measure(fn, (ids, positions, starts, mask), cache_of,
                                           args.calls)
                if reference is None:
                    reference = out
                diff = max((a - b).abs().max().item() for a, b in zip(out, reference, strict=True))
                print(f"{name:8s} b{batch} n{args.nodes} read {args.read_len}: first call "
                      f"{first_s:7.1f} s, {us:8.1f} us per forward, max |diff| to the first "
                      f"variant {diff:.1e}", flush=True)


if __name__ == "__main__":
    main()
