"""Draft trees for DDTree speculative decoding (arXiv 2604.12989) from one DFlash drafter pass.

The drafter gives logits for the next L positions, ``draft_logits [B, L, V]``. A node at depth d
is a prefix u = (u_1..u_d) scored q(u) = sum_i logprob[i-1, u_i], with logprob =
`depth_logprobs(logits)` (float32), accumulated in float32 in path order. Each depth is
restricted to its top K = min(topk, V) tokens, ranked by logit descending, then token id
ascending (so ties are deterministic), and depth to max_depth. The logit order is the log-prob
order (a row's log-probs are its logits less one constant), except where float32 rounding would
merge two log-probs; ranking by logit lets the vectorised pass rank a bf16 row on 32-bit keys
and read no normalised copy of it. Tokens with a -inf logit are not in the lattice. The best
tree with `budget` nodes is the `budget` highest-scoring prefixes; extending a prefix never
raises its score, so that set is prefix-closed.

Order. Nodes are totally ordered by (score desc, depth asc, parent's order, rank asc). A child
comes after its parent (lower or equal score, deeper) and a sibling after the one ranked above it,
so a best-first heap keyed this way pops nodes exactly in this order (Algorithm 1,
`build_tree_heap`). Ties are broken by parent and rank rather than by push order because a sort
can reproduce the former but not the latter. With `spine=True` the greedy chain (rank 0 at every
depth) comes first in depth order and the rest of the budget is filled best-first; every other
node's parent is on the chain or earlier, so the tree stays prefix-closed.

Vectorised pass (`build_tree`). Depth by depth, take the kept depth d-1 nodes x K children and keep
the best `budget` by the order above. That is exact: the global top-`budget` set S holds at most
`budget` depth-d nodes, each with its parent in S (prefix-closed), so by induction S's depth-d
nodes are among the candidates and among the best `budget` of them. Laying candidates out by
(parent slot, rank) and sorting stably by score reproduces the order within a depth; one more
stable sort over all depths laid out in depth order reproduces the global order, so parents
precede children even on exact score ties. Spine nodes get priority through a separate selection
key (+inf), never a modified score. Shapes depend only on (B, budget, K, max_depth) and nothing
reads device data back, so the pass can be captured in a CUDA graph.
"""

from __future__ import annotations

import heapq
import math
import struct
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "Tree",
    "ancestor_mask",
    "build_tree",
    "build_tree_heap",
    "chain_tree",
    "depth_logprobs",
    "tree_from_nodes",
]


@dataclass(slots=True)
class Tree:
    """A batch of flattened draft trees with a fixed node count N (root included)."""

    tokens: Tensor  # [B, N] long; node 0 is the root (anchor token); padding holds 0
    parents: Tensor  # [B, N] long; root and padding -1; a real node's parent index is < its own
    depths: Tensor  # [B, N] long; root and padding 0
    valid: Tensor  # [B, N] bool; root and real nodes True, padding False
    mask: Tensor  # [B, N, N] bool; mask[b, i, j] = j is i or an ancestor of i

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]


def ancestor_mask(parents: Tensor, valid: Tensor, max_depth: int) -> Tensor:
    """Ancestor-or-self mask by pointer jumping: ceil(log2(max_depth + 1)) doublings.

    `max_depth` must bound the deepest node; padding rows see only themselves.
    """
    b, n = parents.shape
    cols = torch.arange(n, device=parents.device)
    mask = (cols[:, None] == cols).expand(b, n, n).clone()  # [B, N, N] distance < 1
    jump = torch.where(valid, parents, -1)  # [B, N] ancestor at distance `reach`, -1 past the root
    reach = 1
    while reach <= max_depth:
        has = jump >= 0  # [B, N]
        hop = jump.clamp(min=0)  # [B, N]
        # Distances [reach, 2 reach) are the ancestor's distances [0, reach).
        mask |= mask.gather(1, hop[:, :, None].expand(b, n, n)) & has[:, :, None]
        jump = torch.where(has, jump.gather(1, hop), -1)
        reach *= 2
    return mask


def _make_tree(tokens: Tensor, parents: Tensor, depths: Tensor, valid: Tensor, depth: int) -> Tree:
    return Tree(tokens, parents, depths, valid, ancestor_mask(parents, valid, depth))


def _root_only(anchors: Tensor, num_nodes: int) -> Tree:
    b, dev = anchors.shape[0], anchors.device
    tokens = torch.zeros(b, num_nodes, dtype=torch.long, device=dev)  # [B, N]
    tokens[:, 0] = anchors
    valid = torch.zeros(b, num_nodes, dtype=torch.bool, device=dev)  # [B, N]
    valid[:, 0].fill_(True)
    parents = torch.full_like(tokens, -1)
    return _make_tree(tokens, parents, torch.zeros_like(tokens), valid, 0)


def chain_tree(anchors: Tensor, draft_tokens: Tensor) -> Tree:
    """Plain DFlash: the root followed by the L drafted tokens in a line (L = 0: root only)."""
    b, n = draft_tokens.shape[0], draft_tokens.shape[1] + 1
    idx = torch.arange(n, device=draft_tokens.device).expand(b, n)  # [B, N]
    tokens = torch.cat([anchors[:, None], draft_tokens], dim=1).long()  # [B, N]
    valid = torch.ones(b, n, dtype=torch.bool, device=tokens.device)
    # A chain's ancestor-or-self mask is the lower triangle: no pointer jumping needed.
    mask = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril().expand(b, n, n)
    return Tree(tokens, idx - 1, idx.clone(), valid, mask)


# --- exact reference: best-first heap ---------------------------------------------------------


def _f32(x: float) -> float:
    """Round to float32, so the reference adds exactly like the float32 tensors do."""
    return struct.unpack("f", struct.pack("f", x))[0]


def depth_logprobs(logits: Tensor) -> Tensor:
    """[..., V] logits -> their float32 log-probabilities, the scores of both builders."""
    x = logits.float()
    return x - x.logsumexp(-1, keepdim=True)


def _ranked(logits: Tensor, k: int) -> list[list[tuple[float, int]]]:
    """Per depth, the top-k (log-prob, token) by logit desc, token id asc."""
    ranked = []
    for row, lp in zip(logits.float().tolist(), depth_logprobs(logits).tolist()):
        top = sorted(range(len(row)), key=lambda t: (-row[t], t))[:k]  # -0.0 == 0.0: id decides
        ranked.append([(lp[t], t) for t in top])
    return ranked


def build_tree_heap(
    anchor: int, logits: Tensor, budget: int, topk: int, max_depth: int, spine: bool
) -> list[tuple[int, int, int]]:
    """Algorithm 1 for one request (`logits` [L, V]); nodes (token, parent, depth) in pop order.

    Node i of the flattened tree is entry i-1; parent 0 is the root (`anchor`, not listed).
    Ties pop by depth, then parent index, then rank: the order `build_tree` reproduces.
    """
    depth_cap, k = max(0, min(max_depth, logits.shape[0])), max(0, min(topk, logits.shape[1]))
    ranked = _ranked(logits[:depth_cap], k)
    nodes: list[tuple[int, int, int]] = []
    heap: list[tuple[float, int, int, int, float]] = []

    def push(parent_score: float, depth: int, parent: int, rank: int) -> None:
        if depth <= len(ranked) and rank < len(ranked[depth - 1]):
            score = _f32(parent_score + ranked[depth - 1][rank][0])
            if math.isfinite(score):  # -inf tokens are outside the lattice, and so are the rest
                heapq.heappush(heap, (-score, depth, parent, rank, parent_score))

    score, parent = 0.0, 0
    for depth in range(1, min(len(ranked), budget) + 1) if spine else ():
        if not ranked[depth - 1] or not math.isfinite(_f32(score + ranked[depth - 1][0][0])):
            break
        nodes.append((ranked[depth - 1][0][1], parent, depth))
        push(score, depth, parent, 1)  # the spine node's siblings still compete best-first
        score, parent = _f32(score + ranked[depth - 1][0][0]), len(nodes)
    push(score, len(nodes) + 1, parent, 0)
    while heap and len(nodes) < budget:
        neg, depth, parent, rank, parent_score = heapq.heappop(heap)
        nodes.append((ranked[depth - 1][rank][1], parent, depth))
        push(parent_score, depth, parent, rank + 1)
        push(-neg, depth + 1, len(nodes), 0)
    return nodes


def tree_from_nodes(anchor: int, nodes: list[tuple[int, int, int]], num_nodes: int) -> Tree:
    """B = 1 tree from `build_tree_heap` output, padded to `num_nodes`; mask by walking up."""
    pad = num_nodes - 1 - len(nodes)
    if pad < 0:
        raise ValueError(f"{len(nodes)} nodes plus the root do not fit in {num_nodes}")
    parents = [-1] + [p for _, p, _ in nodes] + [-1] * pad
    mask = [[False] * num_nodes for _ in range(num_nodes)]
    for i in range(num_nodes):
        j = i
        while j >= 0:
            mask[i][j], j = True, parents[j]
    return Tree(
        tokens=torch.tensor([[anchor] + [t for t, _, _ in nodes] + [0] * pad]),
        parents=torch.tensor([parents]),
        depths=torch.tensor([[0] + [d for _, _, d in nodes] + [0] * pad]),
        valid=torch.tensor([[True] * (len(nodes) + 1) + [False] * pad]),
        mask=torch.tensor([mask]),
    )


# --- vectorised, batched, graph-capturable ----------------------------------------------------


def _rank_tokens(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-k per row by (logit desc, token id asc), tie at rank k included, as (their
    `depth_logprobs`, their ids), each [..., k]: one integer topk and one logsumexp over V."""
    x = logits.float() + 0.0  # folds -0.0 into +0.0, which compare equal in the reference
    ids = _rank_key(x, logits.dtype).topk(k, dim=-1).indices  # [..., k]
    return x.gather(-1, ids) - x.logsumexp(-1, keepdim=True), ids


def _rank_key(x: Tensor, dtype: torch.dtype) -> Tensor:
    """An integer per token of `x` [..., V] (float32 values of `dtype` logits) that orders
    like (logit desc, token id asc): the float's bits made monotonic, the id's complement
    below them. A bf16 logit has 16 bits, so with V <= 2^16 the key fits int32, half the
    bytes for the V-wide pass and the topk; any other dtype takes int64."""
    token = torch.arange(x.shape[-1], device=x.device)  # [V]
    bits = x.view(torch.int32)
    if dtype == torch.bfloat16 and x.shape[-1] <= 1 << 16:
        bits = bits >> 16  # the bf16's own bits, sign-extended: its float32 has 16 zero bits
        ordered = torch.where(bits < 0, bits ^ 0x7FFF, bits)  # integer order = float order
        return ordered * (1 << 16) + (0xFFFF - token.int())
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()
    return ordered * (1 << 32) + (0xFFFFFFFF - token)


def _order(score: Tensor, spine: Tensor) -> Tensor:
    """Selection order: spine first (layout order), then score desc; stable keeps layout ties."""
    key = torch.where(spine, math.inf, torch.where(score.isfinite(), score, -math.inf))
    return torch.sort(key, dim=1, descending=True, stable=True).indices  # [B, C]


def _expand_levels(lp: Tensor, ids: Tensor, budget: int, spine: bool) -> list[tuple[Tensor, ...]]:
    """Per depth: (score, spine, parent candidate, token, depth) of the kept nodes, each [B, M]."""
    b, depth_cap, k = lp.shape
    first = torch.arange(k, device=lp.device) == 0  # [K] the greedy child
    score = lp.new_zeros(b, 1)  # [B, M] the root, as level 0
    on_spine = torch.full((b, 1), spine, dtype=torch.bool, device=lp.device)
    levels, offset, start = [], -1, 0  # root's candidate index is -1
    for d in range(depth_cap):
        cand = (score[:, :, None] + lp[:, d, None, :]).flatten(1)  # [B, M*K]
        cand_spine = (on_spine[:, :, None] & first).flatten(1) & cand.isfinite()  # [B, M*K]
        keep = _order(cand, cand_spine)[:, :budget]  # [B, M']
        score, on_spine = cand.gather(1, keep), cand_spine.gather(1, keep)
        parent = offset + torch.div(keep, k, rounding_mode="floor")  # [B, M'] global candidate
        token = ids[:, d].gather(1, keep % k)  # [B, M']
        levels.append((score, on_spine, parent, token, torch.full_like(token, d + 1)))
        offset, start = start, start + keep.shape[1]
    return levels


def _select(anchors: Tensor, levels: list[tuple[Tensor, ...]], budget: int, depth: int) -> Tree:
    """Global top-`budget` over all levels, parent pointers remapped to node indices, padded."""
    score, spine, parent, token, depths = (torch.cat(parts, dim=1) for parts in zip(*levels))
    b, c = score.shape
    order = _order(score, spine)[:, :budget]  # [B, n]
    n = order.shape[1]
    keep = score.gather(1, order).isfinite()  # [B, n] -inf sorts last, so padding is a tail
    node_of = torch.zeros(b, c, dtype=torch.long, device=score.device)  # [B, C] 0 = not selected
    node_of.scatter_(1, order, torch.arange(1, n + 1, device=score.device).expand(b, n))
    cand_parent = parent.gather(1, order)  # [B, n]
    node_parent = torch.where(cand_parent < 0, 0, node_of.gather(1, cand_parent.clamp(min=0)))
    pad = budget - n  # the lattice holds fewer than `budget` prefixes

    def body(values: Tensor, fill: int) -> Tensor:  # [B, budget]
        return torch.nn.functional.pad(torch.where(keep, values, fill), (0, pad), value=fill)

    root = torch.zeros_like(node_parent[:, :1])  # [B, 1]
    tokens = torch.cat([anchors[:, None].long(), body(token.gather(1, order), 0)], dim=1)
    parents = torch.cat([root - 1, body(node_parent, -1)], dim=1)  # [B, N]
    depths = torch.cat([root, body(depths.gather(1, order), 0)], dim=1)  # [B, N]
    valid = depths > 0  # [B, N] real nodes are at depth >= 1
    valid[:, 0].fill_(True)
    return _make_tree(tokens, parents, depths, valid, depth)


def build_tree(
    anchors: Tensor, logits: Tensor, budget: int, topk: int, max_depth: int, spine: bool
) -> Tree:
    """Batched `build_tree_heap`: same nodes, order and parents; N = budget + 1 always.

    `anchors` [B] long, `logits` [B, L, V] (log-probs serve too); max_depth is capped at L.
    """
    depth_cap, k = min(max_depth, logits.shape[1]), min(topk, logits.shape[2])
    if budget <= 0 or depth_cap <= 0 or k <= 0:
        return _root_only(anchors, max(budget, 0) + 1)
    lp, ids = _rank_tokens(logits[:, :depth_cap], k)  # [B, D, K]
    return _select(anchors, _expand_levels(lp, ids, budget, spine), budget, depth_cap)
