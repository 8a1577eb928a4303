"""The collectives of one forward on one rank, by kind: how many, and how large each is.

These are the communication terms the step model times (`step._target_comm_ms` sums
`Node.collective_ms` over `target_collectives`), and what dflash_core's engine counts per round
(`GenerationStats.comm`), so a test can hold the two to each other. Sizes are each collective's
buffer (all-reduce: the tensor; all-gather: the gathered result), from which the ring's wire
bytes follow.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.launch_params import LaunchParams
from backends.perf_model.catalog import BF16_BYTES, ModelArch


@dataclass(slots=True, frozen=True)
class Collectives:
    count: int
    nbytes: float  # each
    kind: str = ""  # all_reduce | all_gather | all_to_all; "" = the key it is filed under
    group: int = 0  # ranks taking part; 0 = the tensor-parallel group

    @property
    def total(self) -> float:
        return self.count * self.nbytes


def target_collectives(m: ModelArch, lp: LaunchParams, tokens: int,
                       dtype_bytes: int = BF16_BYTES) -> dict[str, Collectives]:
    """One target forward over `tokens` tokens. Tensor-parallel attention: an all-reduce after
    attention and one after the MLP / MoE in every layer (EP combines the replicated tokens with
    the same all-reduce), one for the vocabulary-parallel embedding, and the LM head's gather.
    Attention-DP (`tokens` is then this rank's share): dense layers gather tokens before the MLP
    and scatter them back; MoE layers do the same, or with EP dispatch each token's hidden to
    its top-k experts' ranks and combine it back (all-to-all, tokens x hidden x top-k a way)."""
    if lp.tp_size <= 1:
        return {}
    hidden = tokens * m.hidden * dtype_bytes
    logits = Collectives(1, tokens * m.vocab * dtype_bytes, "all_gather")
    if not lp.enable_dp_attention:
        return {"all_reduce": Collectives(2 * m.num_layers + 1, hidden), "all_gather": logits}
    if lp.ep_size > 1:
        return {"all_gather": Collectives(2 * m.num_dense_layers, hidden),
                "all_to_all": Collectives(2 * m.num_moe_layers, hidden * m.top_k,
                                          group=lp.ep_size),
                "logits": logits}
    return {"all_gather": Collectives(2 * m.num_layers, hidden), "logits": logits}


def context_parallel_collectives(m: ModelArch, heads: int, dcp: int, tokens: int,
                                 dtype_bytes: int = BF16_BYTES) -> dict[str, Collectives]:
    """What decode context parallelism adds to a decode forward over ``tokens`` tokens on a
    rank of ``heads`` query heads: every layer gathers the queries of the ``dcp`` ranks that
    share a request's KV, and sends each rank's partial outputs (with their log-sum-exp, one
    value a head) back to the rank that owns the head, a reduce-scatter. A head's query and
    output are its K width: MLA's latent (absorbed) or GQA's head."""
    width = m.kv_bytes_per_token_layer // BF16_BYTES if not m.kv_heads else m.head_dim
    rows = tokens * heads * dcp
    layers = m.num_attention_layers
    return {"dcp_queries": Collectives(layers, rows * width * dtype_bytes, "all_gather", dcp),
            "dcp_outputs": Collectives(layers, rows * (width + 1) * dtype_bytes,
                                       "reduce_scatter", dcp)}


def replicated_draft_collectives(m: ModelArch, lp: LaunchParams, batch: int,
                                 dtype_bytes: int = BF16_BYTES) -> dict[str, Collectives]:
    """One DFlash draft with the drafter replicated on every rank (dflash_core's choice): only
    the target's embedding (the block) and LM head (block - 1 predicted positions) it borrows
    communicate."""
    if lp.tp_size <= 1:
        return {}
    block = lp.speculative_dflash_block_size
    return {"all_reduce": Collectives(1, batch * block * m.hidden * dtype_bytes),
            "all_gather": Collectives(1, batch * (block - 1) * m.vocab * dtype_bytes)}
