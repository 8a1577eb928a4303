"""DeepSeek-V3 / Kimi K2 shapes read from their ``config.json`` (HF layout).

Accepted: ``DeepseekV3ForCausalLM`` with model_type ``deepseek_v3`` or ``kimi_k2``, and the
K2.5 / K2.6 multimodal wrapper (``KimiK25ForConditionalGeneration``: the text model's config
under ``text_config``, its weights under ``language_model.``; the vision tower is skipped).
What the engine does not implement (another router, attention biases, another quantisation) is
refused with a CheckpointError naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflash_core.models.config import check_bounds, check_types
from dflash_core.models.errors import CheckpointError
from dflash_core.models.int4 import Int4Scheme
from dflash_core.models.yarn import YarnScaling

MODEL_TYPES = ("deepseek_v3", "kimi_k2")
WRAPPER_ARCHITECTURES = ("KimiK25ForConditionalGeneration",)
WRAPPER_TEXT_PREFIX = "language_model."


@dataclass(slots=True)
class DeepseekConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # the dense layers' MLP
    moe_intermediate_size: int  # one routed (and one shared) expert
    num_hidden_layers: int
    num_attention_heads: int
    kv_lora_rank: int  # the latent each token caches
    qk_nope_head_dim: int
    qk_rope_head_dim: int  # the rotary key, shared by all heads, cached beside the latent
    v_head_dim: int
    q_lora_rank: int | None = None  # None: q_proj straight from the hidden state
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    num_experts_per_tok: int = 0
    n_group: int = 1
    topk_group: int = 1
    first_k_dense_replace: int = 0
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    rope_interleave: bool = True  # rotary dims in (even, odd) pairs, as DeepSeek's weights are
    rope_scaling: YarnScaling | None = None
    tie_word_embeddings: bool = False
    quantization: Int4Scheme | None = None  # INT4 routed experts (compressed-tensors)
    weight_prefix: str = ""  # "language_model." inside the K2.5 wrapper

    def __post_init__(self) -> None:
        check_bounds(self)
        dims = (self.vocab_size, self.hidden_size, self.num_hidden_layers,
                self.num_attention_heads, self.kv_lora_rank, self.qk_rope_head_dim,
                self.v_head_dim)
        if min(dims) < 1 or self.qk_nope_head_dim < 0:
            raise CheckpointError("sizes, heads, kv_lora_rank and head dims must be >= 1")
        if self.qk_rope_head_dim % 2:
            raise CheckpointError(f"qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
        if self.n_routed_experts:
            self._check_routing()

    def _check_routing(self) -> None:
        if not 0 < self.num_experts_per_tok <= self.n_routed_experts:
            raise CheckpointError("num_experts_per_tok must be in 1..n_routed_experts")
        if self.n_routed_experts % self.n_group or not 0 < self.topk_group <= self.n_group:
            raise CheckpointError("n_group must divide n_routed_experts and topk_group be in "
                                  "1..n_group")
        if self.n_routed_experts // self.n_group < 2:
            raise CheckpointError("group scores sum each group's best two: a group needs >= 2 "
                                  "experts")

    @property
    def head_dim(self) -> int:
        """The rotary width (what transformers calls head_dim for this model)."""
        return self.qk_rope_head_dim

    @property
    def cached_values_per_token(self) -> int:
        """What one layer's cache holds per token: the latent and the shared rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        scale = (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5
        return scale * (self.rope_scaling.softmax_factor if self.rope_scaling else 1.0)

    @property
    def num_experts(self) -> int:
        """The routed experts (Qwen3-MoE's name for them, which the parallel layout reads)."""
        return self.n_routed_experts

    @property
    def shared_intermediate_size(self) -> int:
        """The shared experts' one MLP."""
        return self.moe_intermediate_size * self.n_shared_experts

    def is_moe_layer(self, layer: int) -> bool:
        return bool(self.n_routed_experts) and layer >= self.first_k_dense_replace

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DeepseekConfig:
        prefix = WRAPPER_TEXT_PREFIX if _is_wrapper(raw) else ""
        text = raw.get("text_config") or raw
        _refuse_unsupported(text)
        check_types(text, _KINDS)
        try:
            kwargs = {name: text[name] for name in _REQUIRED}
        except KeyError as missing:
            raise CheckpointError(f"config.json lacks {missing.args[0]!r}") from None
        kwargs.update({k: text[k] for k in _OPTIONAL if text.get(k) is not None})
        theta = text.get("rope_theta") or (text.get("rope_parameters") or {}).get("rope_theta")
        if theta is not None:
            kwargs["rope_theta"] = theta
        quant = text.get("quantization_config") or raw.get("quantization_config")
        return cls(**kwargs, rope_scaling=YarnScaling.from_config(text),
                   quantization=Int4Scheme.from_config(quant) if quant else None,
                   weight_prefix=prefix)

    def to_dict(self) -> dict[str, Any]:
        """A plain DeepseekV3ForCausalLM config.json (transformers reads it as is)."""
        out = {name: getattr(self, name) for name in _REQUIRED + _OPTIONAL}
        out.update(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
                   rope_theta=self.rope_theta, hidden_act="silu", attention_bias=False,
                   num_key_value_heads=self.num_attention_heads,
                   scoring_func="sigmoid", topk_method="noaux_tc")
        if self.rope_scaling is not None:
            out["rope_scaling"] = self.rope_scaling.to_dict()
            yarn = self.rope_scaling
            out["max_position_embeddings"] = int(yarn.factor * yarn.original_max_position_embeddings)
        if self.quantization is not None:
            out["quantization_config"] = self.quantization.to_config()
        return out


_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
             "v_head_dim")
_OPTIONAL = ("moe_intermediate_size", "q_lora_rank", "n_routed_experts", "n_shared_experts",
             "num_experts_per_tok", "n_group", "topk_group", "first_k_dense_replace",
             "norm_topk_prob", "routed_scaling_factor", "rms_norm_eps", "rope_interleave",
             "tie_word_embeddings")

_INTEGERS = (*_REQUIRED, "moe_intermediate_size", "q_lora_rank", "n_routed_experts",
             "n_shared_experts", "num_experts_per_tok", "n_group", "topk_group",
             "first_k_dense_replace")
_KINDS = {**dict.fromkeys(_INTEGERS, "an integer"), "norm_topk_prob": "true or false",
          "rope_interleave": "true or false", "tie_word_embeddings": "true or false",
          "routed_scaling_factor": "a number", "rms_norm_eps": "a number",
          "rope_theta": "a number"}

# Field -> the values this engine implements (a config omitting the field means the first).
_IMPLEMENTED = {"scoring_func": ("sigmoid",), "topk_method": ("noaux_tc",),
                "hidden_act": ("silu",), "attention_bias": (False,)}


def _is_wrapper(raw: dict[str, Any]) -> bool:
    return any(a in WRAPPER_ARCHITECTURES for a in raw.get("architectures") or [])


def _refuse_unsupported(text: dict[str, Any]) -> None:
    kind = text.get("model_type")
    if kind not in MODEL_TYPES:
        raise CheckpointError(f"model_type {kind!r} is not a DeepSeek-V3 layout "
                              f"(one of {', '.join(MODEL_TYPES)})")
    for name, allowed in _IMPLEMENTED.items():
        if text.get(name, allowed[0]) not in allowed:
            raise CheckpointError(f"config.json: {name} {text[name]!r} is not supported "
                                  f"(this engine implements {allowed[0]!r})")
    heads = text.get("num_key_value_heads")
    if heads is not None and heads != text.get("num_attention_heads"):
        raise CheckpointError("MLA has no grouped K/V heads: num_key_value_heads must equal "
                              "num_attention_heads")


def is_deepseek(raw: dict[str, Any]) -> bool:
    """Whether a config.json describes this architecture (directly or inside the wrapper)."""
    text = raw.get("text_config") or raw
    return text.get("model_type") in MODEL_TYPES or _is_wrapper(raw)
