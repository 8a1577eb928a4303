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
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

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
        _on_side_stream(round_fn)  # the real round, eager
        self.graphs[key] = self._capture(round_fn)
        self.captures += 1

    def _capture(self, round_fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        for generator in self.generators():
            if generator is not None and generator.device.type == "cuda":
                graph.register_generator_state(generator)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self.pool):
            round_fn()
        return graph


def _on_side_stream(fn: Callable[[], None]) -> None:
    """Eager work before a capture runs on a side stream, as capture itself does, so lazily
    created handles belong to a stream the capture can use."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
