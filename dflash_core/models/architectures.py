"""The one place a target's config.json picks its architecture: config class, model, and which
checkpoint keys are its weights. Everything downstream sees a `Target` and its cache."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from torch import Tensor

from dflash_core.models.config import ModelConfig
from dflash_core.models.deepseek_config import DeepseekConfig, is_deepseek
from dflash_core.models.deepseek_target import deepseek_target
from dflash_core.models.target import Target

TargetConfig = ModelConfig | DeepseekConfig


def target_config(raw: dict[str, Any]) -> TargetConfig:
    return DeepseekConfig.from_dict(raw) if is_deepseek(raw) else ModelConfig.from_dict(raw)


def build_target(cfg: TargetConfig) -> Target:
    return _BUILDERS[type(cfg)](cfg)


def target_weights(cfg: TargetConfig, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """The checkpoint's tensors under the model's own names (others are dropped here, so the
    loader's missing / unexpected check sees only what this model could hold)."""
    return _WEIGHT_FILTERS[type(cfg)](cfg, weights)


def _deepseek_weights(cfg: DeepseekConfig, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """Inside the K2.5 wrapper the text model sits under `language_model.` (the vision tower and
    projector are skipped); DeepSeek-V3 also ships its multi-token-prediction layer as
    `model.layers.{num_hidden_layers}`, which the engine does not run."""
    prefix = cfg.weight_prefix
    out = {key[len(prefix):]: value for key, value in weights.items() if key.startswith(prefix)}
    return {key: value for key, value in out.items() if _layer_of(key) < cfg.num_hidden_layers}


def _layer_of(key: str) -> int:
    found = re.match(r"model\.layers\.(\d+)\.", key)
    return int(found.group(1)) if found else -1


_BUILDERS: dict[type, Callable[[Any], Target]] = {ModelConfig: Target,
                                                  DeepseekConfig: deepseek_target}
_WEIGHT_FILTERS: dict[type, Callable[[Any, dict[str, Tensor]], dict[str, Tensor]]] = {
    ModelConfig: lambda cfg, weights: weights, DeepseekConfig: _deepseek_weights}
