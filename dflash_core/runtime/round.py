"""One decode round on the device: draft -> build tree -> verify -> accept -> commit.

Everything a round reads or leaves behind lives in `RoundState`, tensors allocated once for every
row of the batch and rewritten in place. A round over rows [0, n) with a prefix read of
`read_len` slots therefore touches the same storage every time it runs with those two numbers:
that is what lets a CUDA graph capture it once and replay it (graphs.py). Nothing in a round reads
a device value on the host or makes a tensor from a Python list; its one result for the host is
`packet`, read after the round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dflash_core.models.cache import Cache, NodeWrites, slot_index, take_slots
from dflash_core.models.step import Step
from dflash_core.models.target import Target
from dflash_core.parallel.traffic import Traffic
from dflash_core.runtime.compiled import ShapeGraphs, compiled_graphs
from dflash_core.runtime.graphs import RoundGraphs
from dflash_core.runtime.stats import GenerationStats
from dflash_core.speculation.accept import Acceptance, accept
from dflash_core.speculation.proposer import DraftInput, Proposer
from dflash_core.speculation.sampling import SamplingTable, sample_table
from dflash_core.speculation.spec import Spec
from dflash_core.speculation.stages import EAGER_STAGES, TreeStages
from dflash_core.speculation.tree import Tree


@dataclass(slots=True)
class RoundState:
    anchors: Tensor  # [R] long: the token at position `starts`, not yet in the cache
    starts: Tensor  # [R] long: committed length (copied from the host before each round)
    features: Tensor  # [R, A, F]: target features of the last accepted path, for the drafter
    feature_positions: Tensor  # [R, A] long
    packet: Tensor  # [R, 2 + A] long: tau, bonus token, accepted path tokens (the host's read)
    sampling: SamplingTable  # [R] per-row sampling parameters

    @classmethod
    def allocate(cls, rows: int, path_len: int, feature_width: int, dtype: torch.dtype,
                 device: torch.device) -> RoundState:
        long = dict(dtype=torch.long, device=device)
        return cls(torch.zeros(rows, **long), torch.zeros(rows, **long),
                   torch.zeros(rows, path_len, feature_width, dtype=dtype, device=device),
                   torch.arange(path_len, **long).repeat(rows, 1),
                   torch.zeros(rows, 2 + path_len, **long),
                   SamplingTable.allocate(rows, device))


class Round:
    """The device side of a live batch: its stages over the first n rows of `state`.

    The engine keeps one per (Spec, rows, proposer) across batches, so captured graphs outlive a
    `generate` call; a batch only reseeds the generator and brings its own stats."""

    def __init__(self, target: Target, proposer: Proposer | None, cache: Cache, spec: Spec,
                 taps: list[int], fused: bool, cuda_graphs: bool) -> None:
        self.target, self.proposer, self.cache, self.spec = target, proposer, cache, spec
        self.taps, self.fused = taps, fused
        self.device = target.lm_head.weight.device
        self.generator = torch.Generator(self.device)
        self.stats = GenerationStats()
        width = target.config.hidden_size * len(taps)
        self.path_len = spec.tree_depth + 1  # A: the longest accepted path, root included
        # The Spec a round over n rows runs (a smaller tree at higher load, Spec.at_rows).
        self.specs = {n: spec.at_rows(n) for n in range(1, cache.rows + 1)}
        self.state = RoundState.allocate(cache.rows, self.path_len, width, cache.dtype,
                                         self.device)
        # A replayed graph runs no Python, so each shape's collectives are counted when it
        # runs eagerly and added per round from here.
        self.traffic: dict[tuple[int, int, str], Traffic] = {}
        # The verify forward and the tree build; the engine may swap in compiled ones.
        self.forward = target
        self.stages: TreeStages = EAGER_STAGES
        self.graphs = RoundGraphs(
            lambda: [self.generator, getattr(self.proposer, "generator", None)]) \
            if cuda_graphs else None

    def compiled(self) -> list[ShapeGraphs]:
        """The compiled parts' graphs (verify, draft, tree build) this round runs, if any."""
        return compiled_graphs(self.forward, self.proposer, self.stages)

    def reset(self, seed: int, stats: GenerationStats) -> None:
        """A new batch: every row idle, the generator at `seed`, its stats."""
        self.generator.manual_seed(seed)
        self.stats = stats
        self.state.sampling.clear()

    def step(self, n: int, read_len: int, mode: str, stage_timing: bool) -> None:
        """`run`, or the graph of its shape where graphs are on (timed as one "round")."""
        if self.graphs is None:
            self.run(n, read_len, mode, stage_timing)
        else:
            with self.stats.timed("round", self.device, stage_timing):
                self.graphs.run((n, read_len, mode), lambda: self.run(n, read_len, mode, False))
        if self.target.comm is not None:
            self.stats.comm.merge(self.traffic[n, read_len, mode])

    def run(self, n: int, read_len: int, mode: str, stage_timing: bool) -> None:
        """Rows [0, n); `read_len` prefix slots; `mode` = the sampling table's mode for them.
        With stage_timing each stage is timed (a sync per stage on a GPU)."""
        comm = self.target.comm
        mark = comm.traffic.copy() if comm is not None else None
        timed, device = self.stats.timed, self.device
        state, cache = self.state, self.cache.row_range(n)
        starts = state.starts[:n]
        with timed("draft", device, stage_timing):
            draft_logits = self._draft(n, read_len)  # [n, L, V] or None
        with timed("build", device, stage_timing):
            tree = self.stages.tree(self.specs[n], state.anchors[:n], draft_logits)
        with timed("verify", device, stage_timing):
            nodes = NodeWrites(cache)  # the tree's K/V, held until the path is known
            post, features = self._verify(nodes, starts, read_len, tree, mode)
        with timed("accept", device, stage_timing):
            acc = accept(tree, post, self.path_len)
        with timed("commit", device, stage_timing):
            self._commit(nodes, starts, tree, acc, features)
        if mark is not None:
            self.traffic[n, read_len, mode] = comm.traffic.since(mark)

    def _draft(self, n: int, read_len: int) -> Tensor | None:
        if self.spec.method == "none":
            return None
        state = self.state
        return self.proposer.propose(DraftInput(
            state.features[:n], state.feature_positions[:n], state.anchors[:n],
            state.starts[:n], read_len, self.spec.block_size, self.fused))

    def _verify(self, cache: NodeWrites, starts: Tensor, read_len: int, tree: Tree,
                mode: str) -> tuple[Tensor, Tensor]:
        """One target forward over every node of every row -> the target's token per node
        [n, N] and the nodes' features [n, N, F]."""
        nodes = torch.arange(tree.num_nodes, device=self.device)
        step = Step(starts[:, None] + tree.depths, starts[:, None] + nodes, starts, read_len,
                    tree.mask, self.fused)
        hidden, features = self.forward(tree.tokens, step, cache, self.taps)  # [n, N, *]
        table = self.state.sampling.rows(len(starts))
        return sample_table(self.target.logits(hidden), table, self.generator, mode), features

    def _commit(self, nodes: NodeWrites, starts: Tensor, tree: Tree, acc: Acceptance,
                features: Tensor) -> None:
        n, state = len(starts), self.state
        # A chain's (plain, DFlash) path is its nodes 0..A-1 in order (A = N): nothing to gather.
        chain = self.spec.method != "ddtree"
        nodes.commit(starts, None if chain else acc.path, self.path_len)
        if chain:
            state.features[:n].copy_(features)
            accepted = tree.tokens  # [n, A]
        else:  # whole rows picked, as the K/V are (one "head" of width F, of width 1)
            index = slot_index(acc.path, 1, tree.num_nodes)  # [n * A] among the n * N nodes
            picked = take_slots(features[:, None], index, self.path_len)  # [n, 1, A, F]
            state.features[:n].copy_(picked[:, 0])
            accepted = take_slots(tree.tokens[:, None, :, None], index, self.path_len)[:, 0, :, 0]
        offsets = torch.arange(self.path_len, device=self.device)
        state.feature_positions[:n].copy_(starts[:, None] + offsets)
        state.packet[:n].copy_(torch.cat([acc.lengths[:, None], acc.bonus[:, None], accepted], 1))
        state.anchors[:n].copy_(acc.bonus)
