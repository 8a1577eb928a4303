"""The verify forward through torch.compile: the CPU analogue of capturing it in a CUDA graph.

A round's verify is one target forward whose shapes follow the round: rows, tree nodes, prefix
read length. Compiled with dynamic shapes, one graph covers every read length and row count;
Dynamo still specialises sizes 0 and 1 (batch 1, a root-only tree, an empty prefix), so a batch
compiles a few graphs at its first rounds. Those first calls are the warm-up, timed and counted
here (`warmup_s`, `compiles`) so a benchmark can report them beside the rounds they paid for.

`backend`: "inductor" generates fused C++ (CPU) or Triton (CUDA) kernels; "eager" only traces
(Dynamo, no code generation), which checks that the forward compiles without paying for
Inductor. The taps are closed over as a tuple: passed as a list argument, Dynamo would treat the
layer ids as dynamic ints and `layer.index in taps` would stop matching.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import Tensor

from dflash_core.models.cache import Cache
from dflash_core.models.step import Step
from dflash_core.models.target import Target

BACKENDS = ("none", "inductor", "eager")


class CompiledForward:
    """Called like the Target (ids, step, cache, taps) -> (hidden, features), compiled for one
    set of taps; eager-identical tokens (tests/dflash_core_tests/test_compiled_forward.py)."""

    def __init__(self, target: Target, taps: Sequence[int], backend: str) -> None:
        if backend not in BACKENDS[1:]:
            raise ValueError(f"compile backend must be one of {BACKENDS[1:]}, got {backend!r}")
        self.taps = taps = tuple(taps)

        def verify(ids: Tensor, step: Step, cache: Cache) -> tuple[Tensor, Tensor]:
            return target(ids, step, cache, taps)

        self.fn = torch.compile(verify, backend=backend, dynamic=True)
        self.seen: set[tuple] = set()
        self.compiles = 0  # first calls of a shape class (each may compile a graph)
        self.warmup_s = 0.0  # seconds spent in those first calls

    def __call__(self, ids: Tensor, step: Step, cache: Cache,
                 taps: Sequence[int]) -> tuple[Tensor, Tensor]:
        if tuple(taps) != self.taps:
            raise ValueError(f"compiled for taps {self.taps}, called with {tuple(taps)}")
        key = _shape_class(ids, step)
        if key in self.seen:
            return self.fn(ids, step, cache)
        began = time.perf_counter()
        out = self.fn(ids, step, cache)
        self.warmup_s += time.perf_counter() - began
        self.seen.add(key)
        self.compiles += 1
        return out


def _shape_class(ids: Tensor, step: Step) -> tuple:
    """What makes Dynamo compile another graph: sizes of 0 or 1 are specialised, others not."""
    b, n = ids.shape
    return min(b, 2), min(n, 2), min(step.read_len, 2)
