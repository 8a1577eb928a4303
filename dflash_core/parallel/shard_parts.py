"""What the architectures' shard plans share: the slice of a checkpoint tensor a rank holds, the
vocabulary-parallel embedding and LM head, and a SwiGLU MLP split column / row."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from dflash_core.models.layers import MLP
from dflash_core.models.target import Target
from dflash_core.parallel.comm import Comm
from dflash_core.parallel.layout import Layout, Span
from dflash_core.parallel.modules import RowParallelLinear, VocabParallelEmbedding
from dflash_core.parallel.modules import VocabParallelHead


@dataclass(slots=True, frozen=True)
class Slice:
    """Rows (dim 0) or columns (dim 1) `span` of a checkpoint tensor."""

    dim: int
    span: Span


def shard_vocab(target: Target, layout: Layout, comm: Comm) -> dict[str, Slice]:
    """The embedding and LM head split by vocabulary rows (tied again when they were)."""
    cfg = target.config
    vocab = layout.split(cfg.vocab_size, comm.rank)
    target.model.embed_tokens = VocabParallelEmbedding(vocab, cfg.hidden_size, comm)
    target.lm_head = VocabParallelHead(vocab, cfg.hidden_size, comm)
    if cfg.tie_word_embeddings:
        target.lm_head.weight = target.model.embed_tokens.weight
    target.comm = comm
    return {"model.embed_tokens.weight": Slice(0, vocab), "lm_head.weight": Slice(0, vocab)}


def shard_mlp(mlp: MLP, inner: Span, hidden: int, comm: Comm | None,
              prefix: str) -> dict[str, Slice]:
    """`mlp` in place: gate / up column-parallel over `inner`, down row-parallel, all-reduced
    over `comm`, or left a partial sum with comm None (its caller reduces it with others)."""
    mlp.gate_proj = nn.Linear(hidden, inner.count, bias=False)
    mlp.up_proj = nn.Linear(hidden, inner.count, bias=False)
    mlp.down_proj = (nn.Linear(inner.count, hidden, bias=False) if comm is None
                     else RowParallelLinear(inner.count, hidden, comm))
    return {f"{prefix}.gate_proj.weight": Slice(0, inner),
            f"{prefix}.up_proj.weight": Slice(0, inner),
            f"{prefix}.down_proj.weight": Slice(1, inner)}
