"""What to generate and how: prompts, sampling parameters and the speculation method.

Imports nothing heavy (no torch): the tuner reads METHODS and Spec without the engine installed.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from dataclasses import dataclass

METHODS = ("none", "dflash", "ddtree")


# What the engine's per-row device tensors can hold (SamplingTable: float32 and int64). A value
# past these would raise inside the engine's batch, not at the caller.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 2.0**-126  # the smallest normal float32: below it a positive value rounds away
INT64_MAX = 2**63 - 1


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """Applied identically to plain and speculative decoding, which is what keeps T > 0 lossless.

    Checked and normalised on construction (Python ints and floats, a tuple of stop ids), so a
    value the engine's tensors cannot hold is a ValueError here rather than an error inside a
    round that serves other requests too."""

    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    max_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        for name, kind in (("temperature", _real), ("top_p", _real), ("top_k", _integer),
                           ("max_tokens", _integer), ("seed", _integer)):
            object.__setattr__(self, name, kind(name, getattr(self, name)))
        object.__setattr__(self, "stop_token_ids", _stop_ids(self.stop_token_ids))
        _check_ranges(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _check_ranges(p: SamplingParams) -> None:
    # NaN fails every comparison, so `temperature < 0` alone would let it through.
    if not (math.isfinite(p.temperature) and p.temperature >= 0):
        raise ValueError(f"temperature must be finite and >= 0, got {p.temperature}")
    if p.temperature > FLOAT32_MAX or 0 < p.temperature < FLOAT32_TINY:
        raise ValueError(f"temperature must be 0 or in [{FLOAT32_TINY:.4g}, {FLOAT32_MAX:.4g}] "
                         f"(it is held as float32), got {p.temperature}")
    if not FLOAT32_TINY <= p.top_p <= 1:  # written so that NaN fails it
        raise ValueError(f"top_p must be in (0, 1], got {p.top_p}"
                         + (" (below float32's smallest normal)" if p.top_p > 0 else ""))
    if not 0 <= p.top_k <= INT64_MAX:
        raise ValueError(f"top_k must be >= 0, got {p.top_k}" if p.top_k < 0 else
                         f"top_k must be at most {INT64_MAX} (int64), got {p.top_k}")
    if p.max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {p.max_tokens}")


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int past float range
        raise ValueError(f"{name} must fit a float, got an integer of {len(str(value))} "
                         "digits") from None


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _stop_ids(ids: object) -> tuple[int, ...]:
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise ValueError(f"stop_token_ids must be a sequence of token ids, got {ids!r}")
    checked = tuple(_integer("stop_token_ids", t) for t in ids)
    if any(t < 0 for t in checked):
        raise ValueError(f"stop_token_ids must be >= 0, got {min(checked)}")
    return checked


@dataclass(slots=True, frozen=True)
class Spec:
    """none: plain decoding; dflash: a chain of block_size - 1 drafts; ddtree: a best-first tree.

    For ddtree, `budget` counts nodes without the root, `topk` caps candidates per depth and
    `max_depth` the tree's depth; `round_tokens` caps the verify tokens of a round over all its
    rows (rows x nodes). None is "no cap" for each of the three: a depth may hold up to the
    budget, the tree reaches block_size - 1, every load runs the whole budget. `tree_width` and
    `tree_depth` are the caps resolved (`tree_shape`, the one formula the tuner's model shares).
    `spine` puts the greedy chain in first, so with budget and depth >= block_size - 1 the tree
    never accepts less than DFlash with the same drafts. With a round cap a round over more
    rows runs a smaller tree (`at_rows`), never smaller than the chain (block_size - 1 nodes),
    because verify cost follows rows x nodes while a tree's extra acceptance does not. The names
    are the tuning parameters' (speculative_ddtree_topk, ...) without their prefix.
    """

    method: str = "none"
    block_size: int = 1
    budget: int = 0
    topk: int | None = None
    max_depth: int | None = None
    spine: bool = False
    round_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"spec method must be one of {METHODS}, got {self.method!r}")
        if self.method != "none" and self.block_size < 2:
            raise ValueError(f"{self.method} needs block_size >= 2")
        if self.method == "ddtree" and self.budget < 1:
            raise ValueError(f"ddtree needs budget >= 1, got {self.budget}")
        check_tree_caps(self.block_size, self.topk, self.max_depth, self.round_tokens)
        if self.round_tokens is not None and self.method != "ddtree":
            raise ValueError(f"only ddtree has a round_tokens cap, got {self.round_tokens} for "
                             f"{self.method}")

    @classmethod
    def none(cls) -> Spec:
        return cls()

    @classmethod
    def dflash(cls, block_size: int) -> Spec:
        return cls("dflash", block_size)

    @classmethod
    def ddtree(cls, block_size: int, budget: int, topk: int | None = None,
               max_depth: int | None = None, spine: bool = False,
               round_tokens: int | None = None) -> Spec:
        return cls("ddtree", block_size, budget, topk, max_depth, spine, round_tokens)

    @classmethod
    def of(cls, method: str, block_size: int, budget: int = 0, topk: int | None = None,
           max_depth: int | None = None, spine: bool = False,
           round_tokens: int | None = None) -> Spec:
        """From a method name (CLI options, launch parameters); fields the method does not use
        are dropped rather than carried along."""
        if method == "none":
            return cls.none()
        if method == "dflash":
            return cls.dflash(block_size)
        if method == "ddtree":
            return cls.ddtree(block_size, budget, topk, max_depth, spine, round_tokens)
        raise ValueError(f"spec method must be one of {METHODS}, got {method!r}")

    @property
    def draft_len(self) -> int:
        """Drafted positions per round (L = block_size - 1)."""
        return 0 if self.method == "none" else self.block_size - 1

    @property
    def tree_width(self) -> int:
        """Candidates a depth of the tree may hold (a chain: one)."""
        if self.method == "ddtree":
            return tree_shape(self.block_size, self.budget, self.topk, self.max_depth)[0]
        return 1 if self.draft_len else 0

    @property
    def tree_depth(self) -> int:
        """The deepest node a round's tree can hold (the longest accepted path, root excluded)."""
        if self.method == "ddtree":
            return tree_shape(self.block_size, self.budget, self.topk, self.max_depth)[1]
        return self.draft_len

    @property
    def num_nodes(self) -> int:
        """Tokens per request in one verify forward (root included): the most, at one row."""
        return self.budget + 1 if self.method == "ddtree" else self.draft_len + 1

    def at_rows(self, rows: int) -> Spec:
        """The Spec a round over `rows` rows runs: with a round_tokens cap, a DDTree budget of
        round_tokens // rows - 1, within [block_size - 1, budget]; otherwise itself."""
        if self.round_tokens is None:
            return self
        budget = budget_at_rows(self.budget, self.block_size, self.round_tokens, rows)
        return Spec.ddtree(self.block_size, budget, self.topk, self.max_depth, self.spine)


def check_tree_caps(block_size: int, topk: int | None, max_depth: int | None,
                    round_tokens: int | None) -> None:
    """A ValueError unless each cap is None (no cap) or a count it can mean: topk >= 1,
    max_depth in 1..block_size - 1, round_tokens >= 1."""
    for name, value, low in (("topk", topk, 1), ("max_depth", max_depth, 1),
                             ("round_tokens", round_tokens, 1)):
        if value is not None and (isinstance(value, bool) or value < low):
            raise ValueError(f"{name} must be >= {low}, or None for no cap, got {value!r}")
    if max_depth is not None and max_depth > block_size - 1:
        raise ValueError(f"max_depth must be at most block_size - 1 = {block_size - 1}, got "
                         f"{max_depth}")


def tree_shape(block_size: int, budget: int, topk: int | None,
               max_depth: int | None) -> tuple[int, int]:
    """-> (width, depth) a DDTree of `budget` nodes can reach: candidates per depth (topk, no
    cap = the budget: a child ranked below `budget` has `budget` better siblings, so a wider
    depth changes nothing) and depth (max_depth, no cap = block_size - 1, never past the
    budget). The one resolution of the caps, shared by the engine and the tuner's model."""
    width = budget if topk is None else min(topk, budget)
    depth = min(block_size - 1 if max_depth is None else max_depth, block_size - 1, budget)
    return width, depth


def budget_at_rows(budget: int, block_size: int, round_tokens: int | None, rows: int) -> int:
    """A DDTree budget under a cap of `round_tokens` verify tokens per round (None: no cap) over
    `rows` rows: round_tokens // rows - 1 nodes a row, never fewer than the chain's
    block_size - 1 (a tree verifies no less than DFlash would) nor more than `budget`. The one
    formula the engine (Spec.at_rows) and the performance model share."""
    if round_tokens is None:
        return budget
    return min(budget, max(block_size - 1, round_tokens // max(rows, 1) - 1))


def spec_for(method: str, trained_block: int | None, block_size: int | None = None,
             budget: int = 0, topk: int | None = None, max_depth: int | None = None,
             spine: bool = False, round_tokens: int | None = None) -> Spec:
    """A Spec for a drafter trained at `trained_block` (None: no drafter); the block size
    defaults to the trained one."""
    if method != "none" and trained_block is None:
        raise ValueError(f"method {method!r} needs a drafter")
    return Spec.of(method, block_size or trained_block or 1, budget, topk, max_depth, spine,
                   round_tokens)


def checked_prompts(prompts: Sequence[Sequence[int]], vocab_size: int,
                    max_context: int) -> list[list[int]]:
    """The prompts as lists of Python ints, or a ValueError naming the first bad one. Integer
    scalars (numpy, 0-d torch) pass through `__index__`; floats and bools are refused rather
    than truncated, since a float id is a caller's bug, not a token."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise ValueError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    return [_checked_prompt(i, p, vocab_size, max_context) for i, p in enumerate(prompts)]


def _checked_prompt(i: int, prompt: Sequence[int], vocab_size: int,
                    max_context: int) -> list[int]:
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
        raise ValueError(f"prompt {i} must be a list of token ids, got {type(prompt).__name__}")
    if not 1 <= len(prompt) < max_context:
        raise ValueError(f"prompt {i} has {len(prompt)} tokens; every prompt needs "
                         f"1..{max_context - 1} (max_context {max_context})")
    ids = [t if type(t) is int else _token_id(i, t) for t in prompt]  # plain ints: no call
    if min(ids) < 0 or max(ids) >= vocab_size:
        bad = next(t for t in ids if not 0 <= t < vocab_size)
        raise ValueError(f"prompt {i}: token ids must be in 0..{vocab_size - 1}, got {bad}")
    return ids


def _token_id(i: int, token: object) -> int:
    # bool is an int subclass and a bool tensor has __index__; neither is a token id.
    if isinstance(token, bool) or "bool" in str(getattr(token, "dtype", "")):
        raise ValueError(f"prompt {i}: token ids must be integers, got {token!r}")
    try:
        return operator.index(token)
    except TypeError:
        raise ValueError(f"prompt {i}: token ids must be integers, got {token!r}") from None
