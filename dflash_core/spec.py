"""What to generate and how: sampling parameters and the speculation method."""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("none", "dflash", "ddtree")


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """Applied identically to plain and speculative decoding, which is what keeps T > 0 lossless."""

    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    max_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError("need temperature >= 0, top_k >= 0 and 0 < top_p <= 1")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(slots=True, frozen=True)
class Spec:
    """none: plain decoding; dflash: a chain of block_size - 1 drafts; ddtree: a best-first tree.

    For ddtree, `budget` counts nodes without the root, `width` caps candidates per depth
    (0 = the budget, which loses nothing) and `depth` caps the tree depth (0 = block_size - 1).
    `spine` puts the greedy chain in first, so with budget and depth >= block_size - 1 the tree
    never accepts less than DFlash with the same drafts.
    """

    method: str = "none"
    block_size: int = 1
    budget: int = 0
    width: int = 0
    depth: int = 0
    spine: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"spec method must be one of {METHODS}, got {self.method!r}")
        if self.method != "none" and self.block_size < 2:
            raise ValueError(f"{self.method} needs block_size >= 2")
        if self.method == "ddtree" and (self.budget < 1 or self.width < 0):
            raise ValueError("ddtree needs budget >= 1 and width >= 0")
        if not 0 <= self.depth <= max(self.block_size - 1, 0):
            raise ValueError(f"depth must be in 0..block_size-1, got {self.depth}")

    @classmethod
    def none(cls) -> Spec:
        return cls()

    @classmethod
    def dflash(cls, block_size: int) -> Spec:
        return cls("dflash", block_size)

    @classmethod
    def ddtree(cls, block_size: int, budget: int, width: int = 0, depth: int = 0,
               spine: bool = False) -> Spec:
        return cls("ddtree", block_size, budget, width, depth, spine)

    @classmethod
    def of(cls, method: str, block_size: int, budget: int = 0, width: int = 0, depth: int = 0,
           spine: bool = False) -> Spec:
        """From a method name (CLI options, launch parameters); fields the method does not use
        are dropped rather than carried along."""
        if method == "none":
            return cls.none()
        if method == "dflash":
            return cls.dflash(block_size)
        if method == "ddtree":
            return cls.ddtree(block_size, budget, width, depth, spine)
        raise ValueError(f"spec method must be one of {METHODS}, got {method!r}")

    @property
    def draft_len(self) -> int:
        """Drafted positions per round (L = block_size - 1)."""
        return 0 if self.method == "none" else self.block_size - 1

    @property
    def max_depth(self) -> int:
        if self.method == "ddtree":
            return min(self.depth or self.draft_len, self.budget)
        return self.draft_len

    @property
    def num_nodes(self) -> int:
        """Tokens per request in one verify forward (root included)."""
        return self.budget + 1 if self.method == "ddtree" else self.draft_len + 1


def spec_for(method: str, trained_block: int | None, block_size: int | None = None,
             budget: int = 0, width: int = 0, depth: int = 0, spine: bool = False) -> Spec:
    """A Spec for a drafter trained at `trained_block` (None: no drafter); the block size
    defaults to the trained one."""
    if method != "none" and trained_block is None:
        raise ValueError(f"method {method!r} needs a drafter")
    return Spec.of(method, block_size or trained_block or 1, budget, width, depth, spine)
