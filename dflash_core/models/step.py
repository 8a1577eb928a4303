"""Per-forward metadata, so model forwards keep one fixed signature (prefill, verify, draft)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(slots=True)
class Step:
    """Where N new tokens per row sit and what they may attend to.

    positions: RoPE positions; tree siblings share one (start + depth).
    slots:     cache slots the new K/V are written to (start + node index), distinct per node.
    prefix_lens: committed cache length per row; every new token sees all of it, unmasked.
    read_len:  how many cache slots to read (max of prefix_lens, a host int).
    mask:      visibility among the new tokens themselves (ancestor mask, causal, or all).
    fused:     attend with PyTorch's fused attention kernels (see attention.attend).
    biases:    what every layer would make alike (attention biases from mask and prefix_lens),
               memoised by the first layer so the others reuse it (a Step is not modified once
               its forward starts).
    """

    positions: Tensor  # [B, N] long
    slots: Tensor  # [B, N] long
    prefix_lens: Tensor  # [B] long
    read_len: int
    mask: Tensor  # [B, N, N] bool
    fused: bool = False
    biases: dict = field(default_factory=dict)

    @classmethod
    def causal(cls, starts: Tensor, n: int, read_len: int, fused: bool = False) -> Step:
        """A run of n consecutive tokens after each row's prefix (prefill, a DFlash chain)."""
        offsets = torch.arange(n, device=starts.device)
        positions = starts[:, None] + offsets  # [B, N]
        mask = torch.ones(n, n, dtype=torch.bool, device=starts.device).tril()
        return cls(positions, positions, starts, read_len, mask.expand(len(starts), n, n), fused)
