"""CUDA graphs for decode rounds: one graph per round shape, replayed instead of relaunching.

A round's key is (rows, prefix read length, sampling mode); the tree size is fixed by the batch's
Spec. The first round of a key runs eagerly (it is a real round, and it warms up lazily
initialised kernels and workspaces), then the same round is captured without running: capture
only records kernels, so the state the eager run left is untouched. Every later round of that key
replays the graph. All graphs share one memory pool, so their temporaries overlap. Sharing is
safe in any replay order because no tensor allocated during a capture outlives it: a round's
results are copied into `RoundState` buffers allocated outside every graph.

Padding rows write only into their own cache rows and round state, and random draws come from
registered generators, so a replay produces what the eager round would.

Python's cycle collector is paused while a graph is captured: a collection inside a capture
can free an unreachable engine's graphs, and destroying a graph (or its memory) during another
capture invalidates that capture.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager

import torch


class RoundGraphs:
    def __init__(self, generators: Callable[[], list[torch.Generator | None]]) -> None:
        self.generators = generators  # asked at capture: a proposer may make its own lazily
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.captures = 0
        self.replays = 0

    def run(self, key: Hashable, round_fn: Callable[[], None]) -> None:
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
            self.replays += 1
            return
        on_side_stream(round_fn)  # the real round, eager
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        self.graphs[key] = capture(round_fn, self.pool, self.generators())
        self.captures += 1


def capture(fn: Callable[[], None], pool=None,
            generators: Iterable[torch.Generator | None] = ()) -> torch.cuda.CUDAGraph:
    """fn's kernels recorded into a new graph (not run), drawing from `generators`' states."""
    graph = torch.cuda.CUDAGraph()
    for generator in generators:
        if generator is not None and generator.device.type == "cuda":
            graph.register_generator_state(generator)
    with collection_paused(), torch.cuda.graph(graph, pool=pool):
        fn()
    return graph


@contextmanager
def collection_paused() -> Iterator[None]:
    """No cycle collection inside the block (what was collectable is collected after it)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def on_side_stream(fn: Callable[[], None]) -> None:
    """Eager work before a capture runs on a side stream, as capture itself does, so lazily
    created handles belong to a stream the capture can use."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
