"""The one place a target's config.json picks its architecture: config class, model, and which
checkpoint keys are its weights. Everything downstream sees a `Target` and its cache."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from dflash_core.models.config import ModelConfig
from dflash_core.models.deepseek_config import DeepseekConfig, is_deepseek
from dflash_core.models.deepseek_target import deepseek_target
from dflash_core.models.target import Target

TargetConfig = ModelConfig | DeepseekConfig


def target_config(raw: dict[str, Any]) -> TargetConfig:
    return DeepseekConfig.from_dict(raw) if is_deepseek(raw) else ModelConfig.from_dict(raw)


def build_target(cfg: TargetConfig) -> Target:
    return _BUILDERS[type(cfg)](cfg)


def target_key_map(cfg: TargetConfig, keys: list[str]) -> dict[str, str]:
    """Model name -> checkpoint key for the checkpoint's tensors this model can hold (others
    are dropped here, so the loader's missing / unexpected check sees only those)."""
    return _KEY_MAPS[type(cfg)](cfg, keys)


def _deepseek_keys(cfg: DeepseekConfig, keys: list[str]) -> dict[str, str]:
    """Inside the K2.5 wrapper the text model sits under `language_model.` (the vision tower and
    projector are skipped); DeepSeek-V3 also ships its multi-token-prediction layer as
    `model.layers.{num_hidden_layers}`, which the engine does not run."""
    prefix = cfg.weight_prefix
    names = {key[len(prefix):]: key for key in keys if key.startswith(prefix)}
    return {name: key for name, key in names.items() if _layer_of(name) < cfg.num_hidden_layers}


def _layer_of(key: str) -> int:
    found = re.match(r"model\.layers\.(\d+)\.", key)
    return int(found.group(1)) if found else -1


_BUILDERS: dict[type, Callable[[Any], Target]] = {ModelConfig: Target,
                                                  DeepseekConfig: deepseek_target}
_KEY_MAPS: dict[type, Callable[[Any, list[str]], dict[str, str]]] = {
    ModelConfig: lambda cfg, keys: {key: key for key in keys}, DeepseekConfig: _deepseek_keys}
