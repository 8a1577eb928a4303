"""The GEMM shapes one forward runs, read from a model's config fields.

Each weight matrix is one ``Linear``: ``n`` output by ``k`` input features, run ``per_forward``
times (once in every layer that has it), split over the tensor-parallel ranks the way SGLang and
vLLM split it (column-parallel: ``n`` is divided; row-parallel: ``k`` is divided; replicated:
neither). The routed experts are not here: the MoE kernel tables time them whole. MLA's
``kv_b`` projection runs absorbed at decode, as two per-head batched GEMMs (``heads`` says how
many heads it is split into).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

COLUMN, ROW, REPLICATED = "column", "row", "replicated"
BF16, FP8 = "bfloat16", "fp8"
SHARED_EXPERT = "shared_expert"  # the name prefix of a MoE layer's shared-expert linears


@dataclass(slots=True, frozen=True)
class Linear:
    name: str
    n: int
    k: int
    per_forward: int
    split: str  # COLUMN | ROW | REPLICATED
    dtype: str = BF16  # the weight's table dtype
    heads: int = 0  # > 0: absorbed into per-head batched GEMMs over this many heads (MLA kv_b)

    def on_rank(self, tp: int) -> tuple[int, int]:
        """(n, k) of this GEMM on one of ``tp`` ranks."""
        if self.split == COLUMN:
            return max(1, self.n // tp), self.k
        if self.split == ROW:
            return self.n, max(1, self.k // tp)
        return self.n, self.k

    @property
    def params(self) -> int:
        return self.n * self.k * self.per_forward


def target_linears(c: dict[str, Any], dense_bits: float) -> tuple[Linear, ...]:
    """Every non-expert GEMM of a DeepSeek-V3 / Kimi (MLA) or Qwen3 / Llama (GQA) forward, and
    of Kimi-K3's hybrid: KDA linear-attention layers beside the MLA ones, and LatentMoE's
    projections of the hidden stream into the experts' latent and back."""
    hidden, layers = c["hidden_size"], c["num_hidden_layers"]
    dtype = FP8 if dense_bits <= 8 else BF16
    experts = c.get("n_routed_experts") or c.get("num_experts") or 0
    dense_layers = c.get("first_k_dense_replace", 0) if experts else layers
    kda = (c.get("linear_attn_config") or {})
    kda_layers = len(kda.get("kda_layers") or ())
    out = list(_attention(c, hidden, layers - kda_layers, dtype))
    if kda_layers:
        out += _kda(hidden, kda["num_heads"] * kda["head_dim"], kda["num_heads"],
                    kda["head_dim"], kda_layers, dtype)
    inter = c["intermediate_size"]
    out += _mlp("dense_mlp", hidden, inter, dense_layers, dtype)
    n_shared = c.get("n_shared_experts") or c.get("num_shared_experts") or 0
    shared = n_shared * c.get("moe_intermediate_size", 0)
    out += _mlp(SHARED_EXPERT, hidden, shared, layers - dense_layers, dtype)
    latent = c.get("routed_expert_hidden_size") or 0
    if latent and experts:  # replicated on every rank, as the engines run them
        out += [Linear("latent_down", latent, hidden, layers - dense_layers, REPLICATED, dtype),
                Linear("latent_up", hidden, latent, layers - dense_layers, REPLICATED, dtype)]
    out.append(Linear("lm_head", c["vocab_size"], hidden, 1, COLUMN))
    return tuple(x for x in out if x.per_forward and x.n and x.k)


def drafter_linears(hidden: int, layers: int, taps: int, heads: int, kv_heads: int,
                    head_dim: int, inter: int) -> tuple[Linear, ...]:
    """A DFlash drafter: the fusion of the tapped hidden states, then Qwen3-style layers (its
    LM head is the target's, counted there)."""
    qkv = (heads + 2 * kv_heads) * head_dim
    return (Linear("fc", hidden, taps * hidden, 1, REPLICATED),
            Linear("qkv_proj", qkv, hidden, layers, COLUMN),
            Linear("o_proj", hidden, heads * head_dim, layers, ROW),
            *_mlp("mlp", hidden, inter, layers, BF16))


def _attention(c: dict[str, Any], hidden: int, layers: int, dtype: str) -> tuple[Linear, ...]:
    heads = c["num_attention_heads"]
    if "kv_lora_rank" in c:
        kv_lora, rope = c["kv_lora_rank"], c["qk_rope_head_dim"]
        qk_head = c["qk_nope_head_dim"] + rope
        q_lora = c.get("q_lora_rank")
        if q_lora:
            q = (Linear("qkv_a_proj", q_lora + kv_lora + rope, hidden, layers, REPLICATED, dtype),
                 Linear("q_b_proj", heads * qk_head, q_lora, layers, COLUMN, dtype))
        else:
            q = (Linear("q_proj", heads * qk_head, hidden, layers, COLUMN, dtype),
                 Linear("kv_a_proj", kv_lora + rope, hidden, layers, REPLICATED, dtype))
        kv_b = Linear("kv_b_proj", heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), kv_lora,
                      layers, COLUMN, dtype, heads=heads)
        o_width = heads * c["v_head_dim"]
        # Kimi-K3's MLA gates its output per channel from the layer input (mla_use_output_gate).
        gate = ((Linear("o_gate", o_width, hidden, layers, COLUMN, dtype),)
                if c.get("mla_use_output_gate") else ())
        return (*q, kv_b, *gate, Linear("o_proj", hidden, o_width, layers, ROW, dtype))
    head_dim = c.get("head_dim") or hidden // heads
    kv_heads = c.get("num_key_value_heads", heads)
    return (Linear("qkv_proj", (heads + 2 * kv_heads) * head_dim, hidden, layers, COLUMN, dtype),
            Linear("o_proj", hidden, heads * head_dim, layers, ROW, dtype))


def _kda(hidden: int, width: int, heads: int, head_dim: int, layers: int,
         dtype: str) -> tuple[Linear, ...]:
    """A KDA layer: q, k, v and the output gate in one projection, the per-head write
    strength with the forget gate's down projection, the forget gate's up projection (full
    rank: one value a channel), and the output projection."""
    return (Linear("kda_qkvg", 4 * width, hidden, layers, COLUMN, dtype),
            Linear("kda_beta_a", heads + head_dim, hidden, layers, REPLICATED, dtype),
            Linear("kda_gate_b", width, head_dim, layers, COLUMN, dtype),
            Linear("kda_o", hidden, width, layers, ROW, dtype))


def _mlp(name: str, hidden: int, inter: int, count: int, dtype: str) -> tuple[Linear, ...]:
    return (Linear(f"{name}.gate_up", 2 * inter, hidden, count, COLUMN, dtype),
            Linear(f"{name}.down", hidden, inter, count, ROW, dtype))
