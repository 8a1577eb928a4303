"""Next-token training of the target on random windows of the token stream."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dflash_core.models.step import Step
from dflash_core.models.target import Target
from dflash_core.training.optim import Progress, Schedule, fit


def causal_step(batch: int, length: int) -> Step:
    return Step.causal(torch.zeros(batch, dtype=torch.long), length, 0)


def lm_loss(target: Target, windows: Tensor) -> Tensor:
    """windows: [B, T + 1] -> mean next-token cross-entropy."""
    hidden, _ = target(windows[:, :-1], causal_step(*windows[:, :-1].shape))
    logits = target.logits(hidden)  # [B, T, V]
    return F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())


def sample_windows(stream: Tensor, batch: int, length: int, generator: torch.Generator) -> Tensor:
    starts = torch.randint(0, len(stream) - length, (batch,), generator=generator)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])  # [B, length]


def train_target(target: Target, stream: Tensor, schedule: Schedule, seed: int,
                 progress: Progress | None = None) -> list[float]:
    return fit(target, schedule, seed, progress, lambda generator: lm_loss(
        target, sample_windows(stream, schedule.batch, schedule.seq_len + 1, generator)))


@torch.inference_mode()
def held_out_loss(target: Target, stream: Tensor, seq_len: int, windows: int = 32) -> float:
    """Mean loss over evenly spaced held-out windows (deterministic)."""
    step = max(1, (len(stream) - seq_len - 1) // windows)
    batch = torch.stack([stream[i : i + seq_len + 1] for i in range(0, step * windows, step)])
    return lm_loss(target, batch).item()
