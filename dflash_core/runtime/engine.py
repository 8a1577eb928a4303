"""The generate loop: prefill, then rounds of draft -> build tree -> verify -> accept -> commit.

Plain decoding is the same loop with a root-only tree, DFlash a chain, DDTree a best-first tree,
so all three share one verify and one commit (`batch.LiveBatch`). Requests in a batch move
through rounds together; each keeps its own committed length and finishes on its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dflash_core.models.target import Target
from dflash_core.parallel.mirror import mirrored
from dflash_core.runtime.batch import LiveBatch
from dflash_core.runtime.compiled import BACKENDS as COMPILE_BACKENDS
from dflash_core.runtime.compiled import (CompiledForward, CompiledProposer,
                                          CompiledTreeStages, ShapeGraphs, compiled_graphs)
from dflash_core.runtime.round import Round
from dflash_core.runtime.shapes import RoundShapes
from dflash_core.runtime.stats import Generation
from dflash_core.speculation.proposer import DFlashProposer, Proposer
from dflash_core.speculation.spec import SamplingParams, Spec, checked_prompts

DEFAULT_GRAPH_CONTEXT_BUCKET = 256


@dataclass(slots=True)
class EngineConfig:
    max_batch: int = 8
    max_context: int = 4096  # prompt + generated tokens per request
    max_tree_nodes: int = 64  # largest verify per request (root included); sizes the cache
    # Fixed round shapes (see shapes.py): rows rounded up to these batch sizes (the
    # `cuda_graph_bs` tuning parameter) and prefix reads to a power of two below
    # context_bucket, to a multiple of it above (shapes.RoundShapes.read_len).
    batch_buckets: tuple[int, ...] = ()
    context_bucket: int = 0
    # Per-stage times (GenerationStats.stage_s) need a sync at every stage boundary on a GPU,
    # four a round without graphs; off, a round has one sync and stage_s stays all zeros.
    stage_timing: bool = False
    # Attention through PyTorch's fused kernels (no [.., N, S] scores; prefill's memory stops
    # growing with the prompt squared) instead of the reference matmuls.
    fused_attention: bool = False
    # Capture each round shape in a CUDA graph and replay it (graphs.py); needs a CUDA device.
    # Without a context_bucket the prefix read would differ every round, so graphs (and
    # compiled forwards, one per shape too) read in buckets of DEFAULT_GRAPH_CONTEXT_BUCKET
    # slots unless one is set.
    cuda_graphs: bool = False
    # The round's forwards (verify, draft block, DDTree build, prefill) through torch.compile
    # (compiled.py): "none" (eager), "inductor", "max-autotune" (Inductor timing its own GEMM
    # kernels against ATen's) or "eager" (Dynamo tracing only); one fixed-shape graph per
    # shape. Off by default: on the tiny pair on CPU its rounds are faster, but its warm-up (an
    # Inductor compile of 10-25 s per shape) takes thousands of rounds to repay
    # (docs/BENCHMARKS.md, "Compiled rounds"). In fp32 its tokens are eager's; in bf16 a fused
    # kernel rounds differently from eager's ops, so a near-tie may go the other way.
    compile: str = "none"

    def __post_init__(self) -> None:
        if min(self.max_batch, self.max_context, self.max_tree_nodes) < 1:
            raise ValueError("engine limits must be >= 1")
        if self.compile not in COMPILE_BACKENDS:
            raise ValueError(f"compile must be one of {COMPILE_BACKENDS}, got {self.compile!r}")
        if self.compile != "none" and self.cuda_graphs:
            raise ValueError("compile and cuda_graphs are exclusive: graphs replay the eager round")
        RoundShapes(tuple(self.batch_buckets), self.context_bucket)  # validates them
        if self.fixed_shapes and not self.context_bucket:
            self.context_bucket = DEFAULT_GRAPH_CONTEXT_BUCKET

    @property
    def fixed_shapes(self) -> bool:
        """Rounds run per-shape work made ahead (CUDA graphs or compiled forwards), which
        `LiveBatch.capture` makes for every shape before the first request."""
        return self.cuda_graphs or self.compile != "none"


class Engine:
    """Owns the target, the proposer and the static KV cache (allocated once for
    `max_batch x (max_context + max_tree_nodes)`). `generate` runs a static batch to the end;
    `open_batch` gives a live batch that requests can join at any round (for a server)."""

    def __init__(self, target: Target, proposer: Proposer | None = None,
                 config: EngineConfig | None = None) -> None:
        self.target, self.proposer = target, proposer
        self.config = config or EngineConfig()
        self.taps = list(proposer.tap_layers) if proposer else []
        self.capacity = self.config.max_context + self.config.max_tree_nodes
        self.device = target.lm_head.weight.device
        self.cache = target.allocate_cache(self.config.max_batch, self.capacity)
        if self.config.cuda_graphs and self.device.type != "cuda":
            raise ValueError(f"cuda_graphs needs a CUDA device; the target is on {self.device}")
        self._rounds: dict[tuple[Spec, int, Proposer | None], Round] = {}
        # One per engine: every round of it verifies with the same target and taps. A DFlash
        # drafter's block pass is compiled too, in a wrapper: the caller's proposer is not
        # changed (an oracle, or any other proposer, runs as it is).
        self.compiled = CompiledForward(target, self.taps, self.config.compile) \
            if self.config.compile != "none" else None
        if self.compiled is not None and isinstance(proposer, DFlashProposer):
            self.proposer = proposer = CompiledProposer(proposer, self.config.compile)
        self.stages = CompiledTreeStages(self.config.compile) \
            if self.compiled is not None else None
        if proposer is not None:
            # Its cache at the largest size now: a later, larger batch would reallocate it
            # under the graphs captured on the old one.
            proposer.begin(self.config.max_batch, self.capacity)

    def compiled_graphs(self) -> list[ShapeGraphs]:
        """The compiled parts' graphs (verify, draft, tree stages), each with its warm-up."""
        return compiled_graphs(self.compiled, self.proposer, self.stages)

    def open_batch(self, spec: Spec, rows: int | None = None, seed: int = 0) -> LiveBatch:
        """A live batch over cache rows [0, rows) (default: all max_batch of them)."""
        self.check_spec(spec)
        cfg = self.config
        rows = cfg.max_batch if rows is None else rows
        if not 1 <= rows <= cfg.max_batch:
            raise ValueError(f"a batch needs 1..{cfg.max_batch} rows (max_batch), got {rows}")
        batch = LiveBatch(self._round(spec, rows), cfg.max_context, seed,
                          RoundShapes(tuple(cfg.batch_buckets), cfg.context_bucket,
                                      prompt_buckets=cfg.compile != "none"),
                          cfg.stage_timing)
        return mirrored(batch, self.target.comm, spec, rows, seed)  # rank 0 of several: sent on

    def _round(self, spec: Spec, rows: int) -> Round:
        """One Round (device state, captured graphs) per (spec, rows, proposer), kept across
        batches. Batches of one engine share its KV cache: one is open at a time."""
        key = (spec, rows, self.proposer)  # a swapped proposer gets rounds (graphs) of its own
        if key not in self._rounds:
            cfg = self.config
            self._rounds[key] = Round(self.target, self.proposer, self.cache.row_range(rows),
                                      spec, self.taps, cfg.fused_attention, cfg.cuda_graphs)
            if self.compiled is not None:
                self._rounds[key].forward = self.compiled
                self._rounds[key].stages = self.stages
        return self._rounds[key]

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], sampling: SamplingParams | None = None,
                 spec: Spec | None = None) -> Generation:
        sampling, spec = sampling or SamplingParams(), spec or Spec.none()
        prompts = self.check_prompts(prompts)
        if not 1 <= len(prompts) <= self.config.max_batch:
            raise ValueError(f"need 1..{self.config.max_batch} prompts, got {len(prompts)}")
        if not isinstance(sampling, SamplingParams):
            raise ValueError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        began = time.perf_counter()
        batch = self.open_batch(spec, len(prompts), sampling.seed)
        batch.admit(prompts, [sampling] * len(prompts))
        while batch.live_rows():
            batch.step()
        batch.stats.wall_s = time.perf_counter() - began
        requests = batch.requests
        return Generation([r.output for r in requests], [r.finish for r in requests], batch.stats)

    def check_prompts(self, prompts: list[list[int]]) -> list[list[int]]:
        """The prompts as int lists, or a ValueError (spec.checked_prompts, which admit runs
        too; a server calls this on its request thread to refuse a request early)."""
        return checked_prompts(prompts, self.target.config.vocab_size, self.config.max_context)

    def check_spec(self, spec: Spec) -> None:
        if not isinstance(spec, Spec):
            raise ValueError(f"spec must be a Spec, got {type(spec).__name__}")
        if spec.num_nodes > self.config.max_tree_nodes:
            raise ValueError(f"{spec} verifies {spec.num_nodes} nodes > max_tree_nodes "
                             f"{self.config.max_tree_nodes}")
        if spec.method != "none" and self.proposer is None:
            raise ValueError(f"spec {spec.method!r} needs a drafter")
        if spec.method != "none" and spec.block_size > self.proposer.block_size:
            raise ValueError(f"block_size {spec.block_size} > the drafter's trained block "
                             f"{self.proposer.block_size}")
