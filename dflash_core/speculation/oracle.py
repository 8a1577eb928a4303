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

from dflash_core.speculation.proposer import DraftInput


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
        self._device_state: tuple[Tensor, torch.Generator, Tensor] | None = None

    @property
    def generator(self) -> torch.Generator | None:
        """The draw's generator, once the first propose made it (a CUDA graph registers it)."""
        return self._device_state[1] if self._device_state else None

    def begin(self, batch: int, capacity: int) -> None:
        # Reseeded in place: a captured CUDA graph holds these very tensors.
        if self._device_state is not None:
            self._device_state[1].manual_seed(self.seed)

    def absorb(self, rows: list[int], features: Tensor, positions: Tensor) -> None:
        pass  # it reads no target features

    def propose(self, draft: DraftInput) -> Tensor:
        truth_table, generator, profile = self._state(draft.anchors.device)
        depth = draft.block_size - 1
        batch = len(draft.starts)
        index = draft.starts[:, None] + 1 + torch.arange(depth, device=draft.starts.device)
        truth = truth_table[:batch].gather(1, index.clamp_max(truth_table.shape[1] - 1))  # [B, L]
        noise = torch.randn(batch, depth, self.vocab_size, generator=generator,
                            device=truth.device)
        ranks = _ranks(profile[:, :depth], batch, generator)
        return _place(noise, truth, ranks, _confidence(profile[:, :depth]))

    def _state(self, device: torch.device) -> tuple[Tensor, torch.Generator, Tensor]:
        """Device tensors made once, so a round creates none from Python lists (a CUDA graph
        cannot hold a host-to-device copy)."""
        if self._device_state is None:
            width = max(map(len, self.references)) + 1  # past the reference: token 0, no match
            rows = [r + [0] * (width - len(r)) for r in self.references]
            generator = torch.Generator(device).manual_seed(self.seed)
            profile = torch.tensor([self.profile.top1, self.profile.second], device=device)
            self._device_state = (torch.tensor(rows, device=device), generator, profile)
        return self._device_state


def _confidence(profile: Tensor) -> tuple[Tensor, Tensor]:
    """Calibrated draft probabilities of the rank-0 and rank-1 tokens per depth (profile
    [2, L]: top1, second): a drafter that is right 86% of the time puts ~0.86 on its first
    choice, which is what makes the DDTree surrogate (products of these) shape the tree as a
    real drafter would."""
    top1 = profile[0].clamp(0.02, 0.98)
    return top1, torch.minimum(profile[1].clamp_min(0.01), top1 * 0.9)


def _ranks(profile: Tensor, batch: int, generator: torch.Generator) -> Tensor:
    u = torch.rand(batch, profile.shape[1], generator=generator, device=profile.device)
    top1, second = profile[0], profile[0] + profile[1]
    return (u >= top1).long() + (u >= second).long()  # [B, L]: 0, 1 or 2 (= last)


def _place(noise: Tensor, truth: Tensor, ranks: Tensor,
           confidence: tuple[Tensor, Tensor]) -> Tensor:
    """Logits whose softmax gives the rank-0 token `top1`, the rank-1 token `second` and every
    other token an equal share of the rest; the true token sits at its drawn rank (0, 1 or
    below everything). Decoys fill the ranks the truth does not take. noise: [B, L, V]."""
    top1, second = confidence  # [L] each
    vocab = noise.shape[-1]
    rest = (1 - top1 - second).clamp_min(1e-3) / max(vocab - 2, 1)  # [L]
    decoys = noise.scatter(-1, truth[..., None], float("-inf")).topk(2, dim=-1).indices
    first = torch.where(ranks == 0, truth, decoys[..., 0])  # [B, L]
    # Rank 1 goes to the truth, else to the first decoy not already ranked first.
    spare = decoys.gather(-1, (ranks == 2).long()[..., None])[..., 0]  # [B, L]
    runner_up = torch.where(ranks == 1, truth, spare)
    probs = rest[None, :, None].expand_as(noise).clone()  # [B, L, V]
    probs.scatter_(-1, first[..., None], top1.expand_as(first)[..., None])
    probs.scatter_(-1, runner_up[..., None], second.expand_as(first)[..., None])
    last = (ranks == 2)[..., None] & (torch.arange(vocab, device=noise.device) == truth[..., None])
    probs = torch.where(last, probs / 2, probs)  # below every other token
    return probs.log() + 1e-3 * noise  # the noise only orders the equal-share tokens

