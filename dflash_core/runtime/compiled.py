"""The round's forwards through torch.compile: the CPU analogue of capturing them in a CUDA graph.

As with CUDA graphs (graphs.py), one compiled graph per fixed round shape (rows, tree nodes,
prefix read length, cache rows), with no dynamic sizes, so the round's buckets (shapes.py)
bound how many graphs there are. Compiled are the target's verify (`CompiledForward`), the
drafter's block pass (`CompiledProposer`) and the DDTree build (`CompiledTreeStages`); the
acceptance walk and the commit (in-place cache moves) stay eager. The first call of a shape
compiles its graph: that is the warm-up, timed and counted here (`warmup_s`, `compiles`) so a
benchmark can report it beside the rounds it paid for, and `LiveBatch.capture` can pay it
before the first request, as a server captures its graphs.

What a graph takes and leaves, and why (measured, docs/BENCHMARKS.md "Compiled rounds"):
- Plain tensors in: the Step and the cache are rebuilt inside the graph, so their per-forward
  memos (Step.biases, the cache's layer views) are no side effects Dynamo replays per call.
- No cache write inside: an in-place scatter into a graph input is functionalised, and on CPU
  Inductor then copies the whole cache (every layer, every row) per layer written. The verify
  graph holds the new tokens' values (`cache.NodeWrites`) and returns them stacked, one tensor
  per stored tensor; the round (and a prefill) write from them what they keep, and a caller
  that passes a plain cache gets every node written eagerly after the graph, one row copy per
  stored tensor. Exact: a forward's
  layers read only their own layer's prefix, before their own write. The drafter's context
  writes are read by its block pass, so they run eagerly before its graph, which writes
  nothing.
- Fixed sizes: with dynamic=True the prefix read length reached a dict key (the memoised
  attention biases), which specialises it, so every new read length recompiled.

`backend`: "inductor" generates fused C++ (CPU) or Triton (CUDA) kernels, "max-autotune" also
picks each GEMM's kernel by timing (INDUCTOR_OPTIONS); "eager" only traces
(Dynamo, no code generation), which checks that the forward compiles without paying for
Inductor. The taps are closed over as a tuple: passed as a list argument, Dynamo would treat the
layer ids as dynamic ints and `layer.index in taps` would stop matching.
"""

from __future__ import annotations

import dataclasses
import time
import types
from collections.abc import Callable, Hashable, Sequence

import torch
from torch import Tensor

from dflash_core.models.cache import Cache, NodeWrites
from dflash_core.models.kv_cache import KVCache
from dflash_core.models.step import Step
from dflash_core.models.target import Target
from dflash_core.speculation.proposer import DFlashProposer, DraftInput
from dflash_core.speculation.spec import Spec
from dflash_core.speculation.stages import TreeStages
from dflash_core.speculation.tree import Tree

BACKENDS = ("none", "inductor", "max-autotune", "eager")
# Both Inductor modes freeze: the weights are constants of the graph (an engine never changes
# them after load), so Inductor pre-packs each linear's weight once instead of per call. In bf16
# on a CPU with AMX that is what reaches the AMX GEMMs (docs/BENCHMARKS.md, "Compiled
# rounds"); fp32 is unchanged. "max-autotune" also times Inductor's own GEMM kernels (C++ AMX / AVX
# micro-kernels on a CPU, Triton on CUDA) against ATen's for each GEMM shape and keeps the
# fastest: a longer warm-up for cheaper small GEMMs. Graphs are made under inference_mode (the
# engine's), which freezing needs.
INDUCTOR_OPTIONS = {"inductor": {"freezing": True},
                    "max-autotune": {"freezing": True, "max_autotune": True}}


class ShapeGraphs:
    """One compiled graph per shape key, each made on the key's first call (timed)."""

    def __init__(self, backend: str) -> None:
        if backend not in BACKENDS[1:]:
            raise ValueError(f"compile backend must be one of {BACKENDS[1:]}, got {backend!r}")
        self.backend = backend
        self.graphs: dict[Hashable, Callable] = {}
        self.warmup_s = 0.0  # seconds spent in first calls (each compiles a graph)

    @property
    def compiles(self) -> int:
        return len(self.graphs)

    def call(self, key: Hashable, make: Callable[[], Callable], *args: Tensor):
        """The graph of `key` (compiled from `make()` on first use) applied to `args`."""
        graph = self.graphs.get(key)
        if graph is not None:
            return graph(*args)
        graph = self._compile(make())
        began = time.perf_counter()
        out = graph(*args)
        self.warmup_s += time.perf_counter() - began
        self.graphs[key] = graph
        return out

    def _compile(self, fn: Callable) -> Callable:
        # Dynamo keeps its compiled graphs on the function's code object, shared by every
        # closure of one `def`: all shapes of all engines would pile up there, past Dynamo's
        # recompile limit (8), after which it runs eager without a word. A code object of its
        # own gives each shape one entry, dropped with the graph.
        own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                                 fn.__defaults__, fn.__closure__)
        options = INDUCTOR_OPTIONS.get(self.backend)
        backend = "inductor" if options else self.backend
        return torch.compile(own, backend=backend, dynamic=False, options=options)


class CompiledForward:
    """Called like the Target (ids, step, cache, taps) -> (hidden, features), compiled for one
    set of taps; eager-identical tokens (tests/dflash_core_tests/test_compiled_forward.py)."""

    def __init__(self, target: Target, taps: Sequence[int], backend: str) -> None:
        self.target, self.taps = target, tuple(taps)
        self.shapes = ShapeGraphs(backend)

    def __call__(self, ids: Tensor, step: Step, cache: Cache | NodeWrites,
                 taps: Sequence[int]) -> tuple[Tensor, Tensor]:
        if tuple(taps) != self.taps:
            raise ValueError(f"compiled for taps {self.taps}, called with {tuple(taps)}")
        held = cache if isinstance(cache, NodeWrites) else None
        stored_in = held.cache if held is not None else cache
        stored = [getattr(stored_in, f.name) for f in dataclasses.fields(stored_in)]
        args = (ids, step.positions, step.slots, step.prefix_lens, step.mask, *stored)
        # Strides too: a chain's mask is an expanded view, a tree's a full tensor of the same
        # shape, and one graph called with both would fail Dynamo's guards and recompile.
        key = (type(stored_in), *((a.shape, a.stride()) for a in args), step.read_len,
               step.fused)
        hidden, features, nodes = self.shapes.call(
            key, lambda: self._forward(type(stored_in), step.read_len, step.fused), *args)
        if held is not None:  # the round writes the accepted path itself
            held.hold(nodes)
        else:  # every node, eagerly, into the real cache
            stored_in.write_nodes(step.slots, nodes)
        return hidden, features

    def _forward(self, cache_type: type, read_len: int, fused: bool) -> Callable:
        target, taps = self.target, self.taps

        def forward(ids: Tensor, positions: Tensor, slots: Tensor, prefix_lens: Tensor,
                    mask: Tensor, *stored: Tensor) -> tuple[Tensor, Tensor, tuple]:
            step = Step(positions, slots, prefix_lens, read_len, mask, fused)
            nodes = NodeWrites(cache_type(*stored))
            hidden, features = target(ids, step, nodes, taps)
            return hidden, features, nodes.nodes()

        return forward


class CompiledProposer:
    """A DFlashProposer whose block pass (embed, drafter layers, LM head: no cache writes) runs
    compiled per shape (rows, block, prefix read); its context writes stay eager, before it.
    Same logits as the proposer it wraps, which keeps its cache and is not changed."""

    def __init__(self, proposer: DFlashProposer, backend: str) -> None:
        self.proposer = proposer
        self.block_size, self.tap_layers = proposer.block_size, proposer.tap_layers
        self.shapes = ShapeGraphs(backend)

    def begin(self, batch: int, capacity: int) -> None:
        self.proposer.begin(batch, capacity)

    def absorb(self, rows: list[int], features: Tensor, positions: Tensor) -> None:
        self.proposer.absorb(rows, features, positions)

    def propose(self, draft: DraftInput) -> Tensor:
        cache = self.proposer.write_round_context(draft)
        args = (draft.anchors, draft.starts, cache.k, cache.v)
        key = (*(a.shape for a in args), draft.read_len, draft.block_size, draft.fused)
        return self.shapes.call(
            key, lambda: self._block(draft.read_len, draft.block_size, draft.fused), *args)

    def _block(self, read_len: int, block_size: int, fused: bool) -> Callable:
        proposer = self.proposer

        def block(anchors: Tensor, starts: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return proposer.block_logits(anchors, starts, read_len, block_size, fused,
                                         KVCache(k, v))

        return block


class CompiledTreeStages(TreeStages):
    """The DDTree build compiled per shape (rows, drafted positions, vocabulary) and Spec:
    eager it is ~260 small ops. The chain trees (a `cat`) and the acceptance walk (~25 ops)
    stay eager: a compiled call costs about what they cost eager (docs/BENCHMARKS.md). Trees
    are eager's (same tokens, parents, depths, masks), rebuilt from the graph's tensors."""

    def __init__(self, backend: str) -> None:
        self.shapes = ShapeGraphs(backend)

    def tree(self, spec: Spec, anchors: Tensor, draft_logits: Tensor | None) -> Tree:
        if spec.method != "ddtree":
            return super().tree(spec, anchors, draft_logits)
        key = (spec, anchors.shape, draft_logits.shape)
        return Tree(*self.shapes.call(key, lambda: self._tree(spec), anchors, draft_logits))

    def _tree(self, spec: Spec) -> Callable:
        eager = super().tree

        def tree(anchors: Tensor, draft_logits: Tensor) -> tuple[Tensor, ...]:
            t = eager(spec, anchors, draft_logits)
            return t.tokens, t.parents, t.depths, t.valid, t.mask

        return tree


def compiled_graphs(*parts: object) -> list[ShapeGraphs]:
    """The graphs of those of `parts` (a verify forward, a proposer, tree stages) that are
    compiled."""
    return [p.shapes for p in parts
            if isinstance(p, (CompiledForward, CompiledProposer, CompiledTreeStages))]
