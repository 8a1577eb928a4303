"""Model shapes read from Hugging Face ``config.json`` files (Qwen3 dense / MoE, DFlash drafter)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_core.models.errors import CheckpointError
from dflash_core.models.yarn import YarnScaling


@dataclass(slots=True)
class ModelConfig:
    """The subset of a Qwen3 / Qwen3-MoE config the engine needs."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = False
    # MoE (Qwen3-30B-A3B layout); num_experts == 0 means dense.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    rope_scaling: YarnScaling | None = None  # the Kimi DFlash drafters use YaRN

    def __post_init__(self) -> None:
        check_bounds(self)
        if min(self.vocab_size, self.hidden_size, self.num_hidden_layers) < 1:
            raise CheckpointError("vocab_size, hidden_size and num_hidden_layers must be >= 1")
        if min(self.num_attention_heads, self.num_key_value_heads, self.head_dim) < 1:
            raise CheckpointError("attention heads, kv heads and head_dim must be >= 1")
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise CheckpointError("num_experts_per_tok must be in 1..num_experts")

    @property
    def cached_values_per_token(self) -> int:
        """What one layer's cache holds per token (K and V of every KV head)."""
        return 2 * self.num_key_value_heads * self.head_dim

    def is_moe_layer(self, layer: int) -> bool:
        if not self.num_experts or layer in self.mlp_only_layers:
            return False
        return (layer + 1) % self.decoder_sparse_step == 0

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        raw = raw.get("text_config") or raw
        if raw.get("use_sliding_window") or "sliding_attention" in (raw.get("layer_types") or []):
            raise CheckpointError("sliding-window attention layers are not supported by this engine")
        try:
            kwargs = {name: raw[name] for name in _REQUIRED}
        except KeyError as missing:
            raise CheckpointError(f"config.json lacks {missing.args[0]!r}") from None
        check_types(raw)
        kwargs["head_dim"] = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
        kwargs.update({k: raw[k] for k in _OPTIONAL if raw.get(k) is not None})
        # transformers v5 moved rope_theta under rope_parameters; a silent default would be wrong.
        theta = (raw.get("rope_parameters") or {}).get("rope_theta")
        if "rope_theta" not in kwargs and theta is not None:
            kwargs["rope_theta"] = theta
        return cls(**kwargs, rope_scaling=YarnScaling.from_config(raw))

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__slots__}
        out["rope_scaling"] = self.rope_scaling and self.rope_scaling.to_dict()
        out["architectures"] = ["Qwen3MoeForCausalLM" if self.num_experts else "Qwen3ForCausalLM"]
        out["model_type"] = "qwen3_moe" if self.num_experts else "qwen3"
        return out


_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
)
_OPTIONAL = (
    "rms_norm_eps",
    "rope_theta",
    "tie_word_embeddings",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
)


# What each config.json field must hold: JSON gives strings, floats and booleans as easily as
# integers, and a wrong one would otherwise fail deep inside model construction.
_KINDS = {**dict.fromkeys(_REQUIRED + ("head_dim", "num_experts", "num_experts_per_tok",
                                       "moe_intermediate_size", "decoder_sparse_step",
                                       "block_size", "mask_token_id", "num_target_layers"),
                                      "an integer"),
          "rms_norm_eps": "a number", "rope_theta": "a number",
          "tie_word_embeddings": "true or false", "norm_topk_prob": "true or false",
          "mlp_only_layers": "a list of integers", "target_layer_ids": "a list of integers"}


# What a real model's config holds, with room to spare (the largest public ones: vocab ~260k,
# hidden 16k-25k, ~130 layers, 128 heads, head_dim 256, 512 experts). Beyond these a value is a
# typo or a damaged file, and building the model would try to allocate it.
BOUNDS = {"vocab_size": (1, 1 << 22), "hidden_size": (1, 1 << 17),
          "intermediate_size": (1, 1 << 20), "num_hidden_layers": (1, 1024),
          "num_attention_heads": (1, 4096), "num_key_value_heads": (1, 4096),
          "head_dim": (1, 4096), "num_experts": (0, 1 << 14), "num_experts_per_tok": (0, 1 << 14),
          "moe_intermediate_size": (0, 1 << 20), "decoder_sparse_step": (1, 1024),
          # DeepSeek-V3 / Kimi K2's own (deepseek_config)
          "n_routed_experts": (0, 1 << 14), "kv_lora_rank": (1, 1 << 16),
          "qk_rope_head_dim": (1, 4096), "v_head_dim": (1, 4096)}


def check_bounds(config: Any) -> None:
    """A CheckpointError naming the first field of ``config`` (a model's config dataclass)
    out of the bounds a real model's config holds (fields it lacks are skipped); rope_theta
    and rms_norm_eps must be positive."""
    for name, (low, high) in BOUNDS.items():
        value = getattr(config, name, None)
        if value is not None and not low <= value <= high:
            raise CheckpointError(f"config.json: {name} must be in {low}..{high}, got {value}")
    if not 0 < config.rope_theta < float("inf"):
        raise CheckpointError(f"config.json: rope_theta must be a positive number, got "
                              f"{config.rope_theta}")
    if not 0 < config.rms_norm_eps < 1:
        raise CheckpointError(f"config.json: rms_norm_eps must be in (0, 1), got "
                              f"{config.rms_norm_eps}")


def check_types(raw: dict[str, Any], kinds: dict[str, str] | None = None) -> None:
    """A CheckpointError naming the first field of ``raw`` whose value has the wrong type
    (null counts as absent). `kinds`: field -> kind, as `_KINDS` (the default) spells them."""
    for name, kind in (_KINDS if kinds is None else kinds).items():
        value = raw.get(name)
        if value is not None and not _is_kind(value, kind):
            raise CheckpointError(f"config.json: {name} must be {kind}, got {value!r}")


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "true or false":
        return isinstance(value, bool)
    if kind == "a list of integers":
        return isinstance(value, list) and all(_is_kind(v, "an integer") for v in value)
    types = int if kind == "an integer" else (int, float)
    return isinstance(value, types) and not isinstance(value, bool)


@dataclass(slots=True)
class DrafterConfig:
    """A DFlash drafter: Qwen3-style layers plus the fields that tie it to its target."""

    layers: ModelConfig
    block_size: int
    target_layer_ids: list[int]
    mask_token_id: int

    def __post_init__(self) -> None:
        if self.block_size < 2:
            raise CheckpointError(f"block_size must be >= 2, got {self.block_size}")
        if not self.target_layer_ids:
            raise CheckpointError("dflash_config.target_layer_ids is empty")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DrafterConfig:
        layers = ModelConfig.from_dict(raw)
        dflash = raw.get("dflash_config") or {}
        if not isinstance(dflash, dict):
            raise CheckpointError(f"config.json: dflash_config must be an object, got {dflash!r}")
        check_types(dflash)
        if "block_size" not in raw or "mask_token_id" not in dflash:
            raise CheckpointError("drafter config.json needs block_size and dflash_config.mask_token_id")
        layer_ids = dflash.get("target_layer_ids") or default_target_layers(
            raw.get("num_target_layers", 0), layers.num_hidden_layers
        )
        return cls(layers, raw["block_size"], list(layer_ids), dflash["mask_token_id"])

    def to_dict(self) -> dict[str, Any]:
        out = self.layers.to_dict()
        out["architectures"] = ["DFlashDraftModel"]
        out["block_size"] = self.block_size
        out["dflash_config"] = {
            "target_layer_ids": list(self.target_layer_ids),
            "mask_token_id": self.mask_token_id,
        }
        return out

    def check_target(self, target: ModelConfig) -> None:
        """Refuse a drafter that cannot run on this target (it borrows embedding and LM head)."""
        if self.layers.hidden_size != target.hidden_size:
            raise CheckpointError(
                f"drafter hidden_size {self.layers.hidden_size} != target hidden_size "
                f"{target.hidden_size}"
            )
        bad = [i for i in self.target_layer_ids if not 0 <= i < target.num_hidden_layers]
        if bad:
            raise CheckpointError(
                f"target_layer_ids {bad} out of range for a {target.num_hidden_layers}-layer target"
            )
        if not 0 <= self.mask_token_id < target.vocab_size:
            raise CheckpointError(f"mask_token_id {self.mask_token_id} outside the target vocab")
        # Its logits come from the target's LM head, so a drafter trained on another vocabulary
        # would draft ids that mean other tokens (or do not exist).
        if self.layers.vocab_size != target.vocab_size:
            raise CheckpointError(f"drafter vocab_size {self.layers.vocab_size} != target "
                                  f"vocab_size {target.vocab_size}")


def default_target_layers(num_target_layers: int, num_fused: int) -> list[int]:
    """n points evenly spaced over 1..L-3 (the DFlash default when the config lists none)."""
    if num_target_layers < 4:
        raise CheckpointError("drafter config has neither target_layer_ids nor num_target_layers")
    if num_fused == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + span * i / (num_fused - 1)) for i in range(num_fused)]


def read_config(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path} not found")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} must hold a JSON object of config fields, "
                              f"not a {type(raw).__name__}")
    return raw
