"""Fixed round shapes: what a CUDA graph needs, since a graph replays one shape only.

A round's shapes are the rows it runs over, the prefix length every attention reads and the tree
size. The tree size is fixed by the Spec; the other two follow the load (live rows) and the
longest context. Rounding them up to a few buckets bounds the set of shapes, so one graph per
(batch bucket, read bucket) can cover every round. Padding is harmless by construction: rows
without a live request compute into their own cache rows and are never emitted, and prefix
slots past a row's length are masked by its key-length bias.

Read buckets are powers of two (from MIN_READ_BUCKET) below `context_bucket` and its multiples
from there: a masked slot costs as much as a read one, so a short context in a 256-slot bucket
paid for 256 (a DFlash round at 8 rows on the tiny pair, bf16, compiled: 1.24x the time of
a 64-slot read at 256, 1.17x at 128; docs/BENCHMARKS.md, "Engine internals"), while
long contexts keep the linear steps that bound the waste to one bucket.
"""

from __future__ import annotations

from dataclasses import dataclass


MIN_PROMPT_BUCKET = 16
MIN_READ_BUCKET = 64  # below it a read costs little next to the round's GEMMs


@dataclass(slots=True, frozen=True)
class RoundShapes:
    batch_buckets: tuple[int, ...] = ()  # round rows: the smallest bucket >= the rows needed
    # Prefix reads rounded up to a power of two below this, to a multiple of it above (0: exact)
    context_bucket: int = 0
    # Prefill one request per forward, its prompt padded to a power of two (>= 16): the
    # compiled prefill's shapes, one per bucket up to max_context (a few, all made ahead).
    # Off: one forward for all prompts admitted together, padded to the longest.
    prompt_buckets: bool = False

    def __post_init__(self) -> None:
        if any(b < 1 for b in self.batch_buckets) or self.context_bucket < 0:
            raise ValueError("batch buckets must be >= 1 and context_bucket >= 0")

    def rows(self, needed: int, available: int) -> int:
        """Rows to run: ``needed`` rounded up to a bucket, never past the batch's rows."""
        fitting = [b for b in self.batch_buckets if needed <= b <= available]
        return min(fitting) if fitting else (available if self.batch_buckets else needed)

    def read_len(self, longest: int, capacity: int) -> int:
        """Prefix slots to read for a longest committed context of ``longest``: a power of two
        (>= MIN_READ_BUCKET, or the bucket if smaller) while that is below the context bucket,
        else its next multiple; never past the cache."""
        if not self.context_bucket or longest == 0:
            return longest
        bucket = self.context_bucket
        power = min(MIN_READ_BUCKET, bucket)
        while power < longest:
            power *= 2
        read = power if power < bucket else -(-longest // bucket) * bucket
        return min(read, capacity)

    def all_rows(self, available: int) -> list[int]:
        """Every row count a round can run over, largest first (the order to capture in)."""
        return sorted({self.rows(k, available) for k in range(1, available + 1)}, reverse=True)

    def all_read_lens(self, max_context: int, capacity: int) -> list[int]:
        """Every bucketed prefix read of contexts 1..max_context - 1, largest first; needs a
        context bucket (exact reads take every length)."""
        if not self.context_bucket:
            raise ValueError("every read length is possible without a context_bucket")
        return sorted({self.read_len(n, capacity) for n in range(1, max_context)}, reverse=True)

    def prompt_len(self, longest: int, capacity: int) -> int:
        """Prefill positions for a prompt of ``longest`` tokens (prompt_buckets on)."""
        bucket = MIN_PROMPT_BUCKET
        while bucket < longest:
            bucket *= 2
        return min(bucket, capacity)

    def all_prompt_lens(self, max_context: int, capacity: int) -> list[int]:
        """Every prefill length of prompts of 1..max_context - 1 tokens, largest first."""
        return sorted({self.prompt_len(n, capacity) for n in range(1, max_context)},
                      reverse=True)
