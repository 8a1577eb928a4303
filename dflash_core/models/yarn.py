"""YaRN RoPE scaling (the ``rope_scaling`` / ``rope_parameters`` of type "yarn").

Frequencies below the ``beta_slow`` rotation count are interpolated by ``factor``, those above
``beta_fast`` kept, a linear ramp in between. The cos/sin tables are multiplied by
``attention_factor`` (so the rotary part of every score scales by its square). DeepSeek-style
attention (MLA) also multiplies the softmax scale by ``mscale(mscale_all_dim) ** 2``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dflash_core.models.errors import CheckpointError


@dataclass(slots=True, frozen=True)
class YarnScaling:
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0  # 0: absent (the attention factor then uses the plain log rule)
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None  # None: derived from factor / mscale as below
    truncate: bool = True  # round the ramp's ends outwards to whole dimensions

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> YarnScaling | None:
        """From a config's ``rope_scaling`` (checkpoints) or ``rope_parameters`` (transformers
        v5); None for plain RoPE. Any other scaling type is refused, never ignored."""
        params = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
        kind = params.get("rope_type") or params.get("type") or "default"
        if kind == "default":
            return None
        if kind != "yarn":
            raise CheckpointError(f"rope scaling type {kind!r} is not supported (only yarn)")
        original = params.get("original_max_position_embeddings") or raw.get(
            "max_position_embeddings")
        factor = params.get("factor") or (original and raw.get("max_position_embeddings", 0)
                                          / original)
        if not factor or not original:
            raise CheckpointError("yarn rope scaling needs factor and "
                                  "original_max_position_embeddings")
        optional = {k: params[k] for k in ("mscale", "mscale_all_dim", "attention_factor",
                                           "truncate") if params.get(k) is not None}
        return cls(float(factor), int(original), float(params.get("beta_fast") or 32),
                   float(params.get("beta_slow") or 1), **optional)

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__slots__}
        return {"rope_type": "yarn", **{k: v for k, v in out.items() if v is not None}}

    @property
    def cos_sin_factor(self) -> float:
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor,
                                                                        self.mscale_all_dim)
        return yarn_mscale(self.factor)

    @property
    def softmax_factor(self) -> float:
        """What MLA multiplies its softmax scale by (1 without mscale_all_dim)."""
        return yarn_mscale(self.factor, self.mscale_all_dim) ** 2 if self.mscale_all_dim else 1.0

    def inv_freq(self, dim: int, theta: float, device: torch.device) -> Tensor:
        """[dim / 2] inverse frequencies, blended between interpolated and original."""
        base = theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
        low, high = self._ramp_ends(dim, theta)
        ramp = ((torch.arange(dim // 2, device=device, dtype=torch.float32) - low)
                / max(high - low, 1e-3)).clamp(0, 1)
        keep = 1 - ramp  # 1: extrapolate (keep the original frequency), 0: interpolate
        return (1.0 / (self.factor * base)) * (1 - keep) + (1.0 / base) * keep

    def _ramp_ends(self, dim: int, theta: float) -> tuple[float, float]:
        def dim_of(rotations: float) -> float:
            wavelength = self.original_max_position_embeddings / (rotations * 2 * math.pi)
            return dim * math.log(wavelength) / (2 * math.log(theta))

        low, high = dim_of(self.beta_fast), dim_of(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, dim - 1)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
