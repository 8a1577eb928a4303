"""The training loop both models share: AdamW, warm-up + cosine schedule, clipping, seeded data."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

Progress = Callable[[int, float], None]  # step, loss


@dataclass(slots=True)
class Schedule:
    steps: int
    batch: int
    seq_len: int
    lr: float
    warmup: int = 20
    weight_decay: float = 0.1

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then cosine decay to 10% of the peak."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def init_weights(model: torch.nn.Module, std: float = 0.02) -> None:
    """HF-style init: small normal weights (the default N(0, 1) embedding, tied to the LM head,
    would start with logits in the hundreds)."""
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, std=std)


def make_optimizer(params, schedule: Schedule) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=schedule.lr, betas=(0.9, 0.95),
                             weight_decay=schedule.weight_decay)


def fit(model: torch.nn.Module, schedule: Schedule, seed: int, progress: Progress | None,
        batch_loss: Callable[[torch.Generator], Tensor]) -> list[float]:
    """Run `schedule.steps` steps on the trainable parameters; `batch_loss` draws its own batch
    from the seeded generator. Returns the loss per step."""
    generator = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, schedule)
    model.train()
    losses = []
    for step in range(schedule.steps):
        for group in optimizer.param_groups:
            group["lr"] = schedule.lr_at(step)
        loss = batch_loss(generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(loss.item())
        if progress:
            progress(step, losses[-1])
    model.eval()
    return losses
