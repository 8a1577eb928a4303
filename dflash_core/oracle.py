"""An oracle proposer for tests and benchmarks: draft logits steered toward a known continuation.

With no trained drafter, acceptance is noise. The oracle knows each request's true continuation
(e.g. the plain greedy output) and, per depth, puts the true token at rank 0 with probability
`top1[d]`, at rank 1 with probability `second[d]`, and last otherwise. So a chain accepts
depth d with probability top1[d], and a tree holding the top-2 lattice with top1[d] + second[d]:
acceptance profiles are set, not hoped for, and speed can be measured without trained weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dflash_core.proposer import DraftInput


@dataclass(slots=True)
class AcceptanceProfile:
    top1: list[float]  # per depth 1..L: P(true token ranked first)
    second: list[float]  # per depth: P(true token ranked second)

    def __post_init__(self) -> None:
        if len(self.top1) != len(self.second) or any(
                a < 0 or b < 0 or a + b > 1 for a, b in zip(self.top1, self.second)):
            raise ValueError("need per-depth probabilities with top1 + second <= 1")

    @classmethod
    def constant(cls, depth: int, top1: float, second: float = 0.0) -> AcceptanceProfile:
        return cls([top1] * depth, [second] * depth)


class OracleProposer:
    """Everything stays on the device of the draft input (no host reads), so a benchmark's
    draft stage costs a noise draw and a top-2, not a host round trip."""

    def __init__(self, references: list[list[int]], vocab_size: int, block_size: int,
                 profile: AcceptanceProfile, seed: int = 0) -> None:
        if len(profile.top1) < block_size - 1:
            raise ValueError(f"profile covers {len(profile.top1)} depths < {block_size - 1}")
        self.block_size, self.vocab_size, self.profile = block_size, vocab_size, profile
        self.references = references  # prompt + true continuation, per request
        self.seed = seed
        self.tap_layers: list[int] = []  # needs no target features
        self._device_state: tuple[Tensor, torch.Generator] | None = None

    def begin(self, batch: int, capacity: int) -> None:
        self._device_state = None  # reseeded on the first propose

    def propose(self, draft: DraftInput) -> Tensor:
        truth_table, generator = self._state(draft.anchors.device)
        depth = draft.block_size - 1
        batch = len(draft.starts)
        index = draft.starts[:, None] + 1 + torch.arange(depth, device=draft.starts.device)
        truth = truth_table[:batch].gather(1, index.clamp_max(truth_table.shape[1] - 1))  # [B, L]
        noise = torch.randn(batch, depth, self.vocab_size, generator=generator,
                            device=truth.device)
        return _place(noise, truth, self._ranks(batch, depth, generator))

    def _state(self, device: torch.device) -> tuple[Tensor, torch.Generator]:
        if self._device_state is None:
            width = max(map(len, self.references)) + 1  # past the reference: token 0, no match
            rows = [r + [0] * (width - len(r)) for r in self.references]
            generator = torch.Generator(device).manual_seed(self.seed)
            self._device_state = (torch.tensor(rows, device=device), generator)
        return self._device_state

    def _ranks(self, batch: int, depth: int, generator: torch.Generator) -> Tensor:
        device = generator.device
        u = torch.rand(batch, depth, generator=generator, device=device)
        top1 = torch.tensor(self.profile.top1[:depth], device=device)
        second = top1 + torch.tensor(self.profile.second[:depth], device=device)
        return (u >= top1).long() + (u >= second).long()  # [B, L]: 0, 1 or 2 (= last)


def _place(noise: Tensor, truth: Tensor, ranks: Tensor) -> Tensor:
    """Set the true token's logit so it sits at rank 0, 1 or last among the noise."""
    others = noise.scatter(-1, truth[..., None], float("-inf"))  # [B, L, V]
    top2 = others.topk(2, dim=-1).values  # [B, L, 2]
    lowest = noise.min(-1).values - 1.0
    value = torch.stack([top2[..., 0] + 1.0, top2.mean(-1), lowest], dim=-1)  # [B, L, 3]
    chosen = value.gather(-1, ranks[..., None])  # [B, L, 1]
    return noise.scatter(-1, truth[..., None], chosen)
