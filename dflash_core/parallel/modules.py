"""Shards of the layers: what `shard.parallelize` puts in place of the full modules (the
DeepSeek MoE's own in modules_deepseek.py).

Column-parallel projections (q, k, v, gate, up) are plain nn.Linear shards and need no
communication; the row-parallel ones (o, down) and the routed experts sum their partial outputs
over the ranks; the embedding and LM head split the vocabulary. Every shard keeps the full
module's `weight` name, so the HF key of a parameter is still its name in the model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dflash_core.models.layers import Experts
from dflash_core.parallel.comm import Comm
from dflash_core.parallel.layout import Span


class RowParallelLinear(nn.Module):
    """x [..., in / tp] (this rank's slice) -> the full x @ W.T [..., out], summed over ranks."""

    def __init__(self, in_shard: int, out: int, comm: Comm) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out, in_shard))
        self.comm = comm

    def forward(self, x: Tensor) -> Tensor:
        return self.comm.all_reduce(F.linear(x, self.weight))


class VocabParallelEmbedding(nn.Module):
    """Rows `vocab` of the table: ids outside them look up zeros, the sum over ranks the row."""

    def __init__(self, vocab: Span, hidden: int, comm: Comm) -> None:
        super().__init__()
        self.vocab, self.comm = vocab, comm
        self.weight = nn.Parameter(torch.empty(vocab.count, hidden))

    def forward(self, ids: Tensor) -> Tensor:
        local = ids - self.vocab.start
        mine = (local >= 0) & (local < self.vocab.count)
        rows = F.embedding(local.clamp(0, self.vocab.count - 1), self.weight)  # [..., H]
        return self.comm.all_reduce(rows * mine[..., None].to(rows.dtype))


class VocabParallelHead(nn.Module):
    """Logits of this rank's vocabulary rows, gathered: every rank gets all V logits, so
    sampling, tree building and the acceptance walk run unchanged and identically."""

    def __init__(self, vocab: Span, hidden: int, comm: Comm) -> None:
        super().__init__()
        self.vocab, self.comm = vocab, comm
        self.weight = nn.Parameter(torch.empty(vocab.count, hidden))

    def forward(self, hidden: Tensor) -> Tensor:
        return self.comm.all_gather(F.linear(hidden, self.weight))  # [..., V]


class LocalExperts(Experts):
    """Experts `span` of E, each over its `slice` of the intermediate dimension: this rank's
    partial sum of the routed experts' outputs (callers all-reduce it).

    Every rank holds every token (attention is tensor-parallel, so the MoE input is replicated),
    so dispatch is local: a rank runs the (token, slot) pairs routed to its experts, with zero
    weight for the others, and the combine is one all-reduce of the partial sums. That moves the
    same bytes as a TP MLP's all-reduce; an all-to-all would only pay off once tokens are not
    replicated (attention-DP)."""

    def __init__(self, experts: Span, hidden: int, intermediate: Span) -> None:
        super().__init__(experts.count, hidden, intermediate.count)
        self.span, self.slice = experts, intermediate

    def forward(self, tokens: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        return super().forward(tokens, *owned_pairs(self.span, weights, experts))  # [T, H]


class ShardedExperts(LocalExperts):
    """Qwen3-MoE's routed experts over the ranks: the partial sums, all-reduced."""

    def __init__(self, experts: Span, hidden: int, intermediate: Span, comm: Comm) -> None:
        super().__init__(experts, hidden, intermediate)
        self.comm = comm

    def forward(self, tokens: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        return self.comm.all_reduce(super().forward(tokens, weights, experts))


def owned_pairs(span: Span, weights: Tensor, experts: Tensor) -> tuple[Tensor, Tensor]:
    """Routing weights and expert ids [T, k] -> (the weights, zero for the experts this rank does
    not hold; local ids of the held ones, any valid id for the rest)."""
    local = experts - span.start  # [T, k]
    mine = (local >= 0) & (local < span.count)
    return weights * mine.to(weights.dtype), local.clamp(0, span.count - 1)
