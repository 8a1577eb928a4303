"""Expected accepted tokens per verify step, for a DFlash chain or a DDTree tree.

The drafter is described by a per-position profile: ``profile[d-1]`` is the probability that the
drafter's top-1 token at depth d is the target's token, given the path above it was right. The
rest of that probability is spread over lower ranks geometrically: rank r >= 2 gets
``(1 - a) * (1 - rank_decay) * rank_decay ** (r - 2)``. Ranks at different depths are treated
as independent, so the probability that the target walks through a tree node is the product of
its ranks' probabilities, and a tree's expected acceptance length is 1 (the bonus token) plus
the sum of its nodes' probabilities. The best tree for a node budget is the DDTree best-first
choice over those products, so the chain (top-K = 1) is the special case DFlash runs.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

from backends.errors import UserError


@dataclass(slots=True, frozen=True)
class DrafterProfile:
    top1: tuple[float, ...]
    rank_decay: float = 0.6

    def __post_init__(self) -> None:
        if not self.top1 or not all(0.0 <= a <= 1.0 for a in self.top1):
            raise UserError("acceptance profile entries must be probabilities in [0, 1]")
        if not 0.0 <= self.rank_decay < 1.0:
            raise UserError("rank_decay must be in [0, 1)")

    def rank_prob(self, depth: int, rank: int) -> float:
        """P(target token = drafter's rank-``rank`` token at ``depth`` | correct prefix)."""
        a = self.top1[min(depth, len(self.top1)) - 1]
        if rank == 1:
            return a
        return (1.0 - a) * (1.0 - self.rank_decay) * self.rank_decay ** (rank - 2)


@dataclass(slots=True, frozen=True)
class Acceptance:
    mean: float
    # hist[n-1] = P(exactly n tokens committed in a step), n = 1 .. depth + 1
    hist: tuple[float, ...]
    nodes: int = 0  # the tree's non-root nodes (fewer than the budget when width x depth is)


def chain_acceptance(profile: DrafterProfile, block_size: int) -> Acceptance:
    """DFlash: one chain of ``block_size - 1`` draft tokens."""
    return tree_acceptance(profile, budget=block_size - 1, topk=1, max_depth=block_size - 1)


def tree_acceptance(profile: DrafterProfile, budget: int, topk: int,
                    max_depth: int) -> Acceptance:
    """DDTree: the best ``budget`` non-root nodes, at most ``topk`` children a node."""
    return _tree(profile, budget, topk, max_depth)


@lru_cache(maxsize=4096)
def _tree(profile: DrafterProfile, budget: int, topk: int, max_depth: int) -> Acceptance:
    reach = [0.0] * (max_depth + 1)  # reach[d] = P(the accepted path reaches depth d)
    reach[0] = 1.0
    # Heap of candidate nodes: (-probability, depth, rank, parent probability).
    heap = [(-profile.rank_prob(1, 1), 1, 1, 1.0)] if max_depth >= 1 and budget >= 1 else []
    taken = 0
    while heap and taken < budget:
        neg_p, depth, rank, parent_p = heapq.heappop(heap)
        p = -neg_p
        reach[depth] += p
        taken += 1
        if rank < topk:  # next sibling: same parent, next drafter rank
            heapq.heappush(heap, (-parent_p * profile.rank_prob(depth, rank + 1),
                                  depth, rank + 1, parent_p))
        if depth < max_depth:  # first child
            heapq.heappush(heap, (-p * profile.rank_prob(depth + 1, 1), depth + 1, 1, p))
    hist = tuple(reach[d] - (reach[d + 1] if d < max_depth else 0.0)
                 for d in range(max_depth + 1))
    return Acceptance(mean=sum(reach), hist=hist, nodes=taken)


def profile_for_length(acceptance_length: float, block_size: int,
                       rank_decay: float = 0.6) -> DrafterProfile:
    """The constant per-position profile whose block-``block_size`` chain accepts
    ``acceptance_length`` tokens a round on average (bonus token included), as engines report
    it ("accept length"). Bisection: the chain's mean grows monotonically with the top-1 rate."""
    if not 1.0 <= acceptance_length <= block_size:
        raise UserError(f"acceptance length {acceptance_length} must lie in [1, block size "
                        f"{block_size}]")
    low, high = 0.0, 1.0
    for _ in range(50):
        mid = (low + high) / 2
        mean = chain_acceptance(DrafterProfile((mid,), rank_decay), block_size).mean
        low, high = (mid, high) if mean < acceptance_length else (low, mid)
    return DrafterProfile((round((low + high) / 2, 6),), rank_decay)
