"""The one way checkpoints become an engine: load the models, then assemble the engine.

The generate CLI, the server and the in-process backend all need target + drafter + proposer +
EngineConfig put together the same way (and graphs turned on under the same condition), so the
assembly lives here and a new engine option reaches all of them at once.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dflash_core.models.drafter import Drafter
from dflash_core.models.loader import load_drafter, load_target
from dflash_core.models.target import Target
from dflash_core.parallel.comm import Comm
from dflash_core.parallel.layout import Layout
from dflash_core.parallel.shard import load_sharded_target
from dflash_core.runtime.engine import Engine, EngineConfig
from dflash_core.speculation.proposer import DFlashProposer, Proposer


def load_models(target_dir: str | Path, drafter_dir: str | Path | None = None,
                dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu",
                layout: Layout | None = None, comm: Comm | None = None
                ) -> tuple[Target, Drafter | None]:
    """The target and, given a directory, its drafter, checked against the target (hidden size,
    taps, mask token, vocabulary). `dtype` is a torch.dtype or its name ("bfloat16"). With a
    `layout` over several ranks the target holds this rank's (`comm.rank`) shards; the drafter
    is small and replicated."""
    dtype = as_dtype(dtype)
    if layout is not None and layout.world > 1:
        target = load_sharded_target(target_dir, layout, comm, dtype, device)
    else:
        target = load_target(target_dir, dtype, device)
    drafter = load_drafter(drafter_dir, target.config, dtype, device) if drafter_dir else None
    return target, drafter


def build_engine(target: Target, drafter: Drafter | None = None, *, max_batch: int,
                 max_context: int, max_tree_nodes: int, batch_buckets: tuple[int, ...] = (),
                 cuda_graphs: bool | None = None, proposer: Proposer | None = None,
                 **options) -> Engine:
    """An Engine with `drafter` as its DFlash proposer (None: plain decoding only), or with
    `proposer` instead (an oracle, in tests and benchmarks).

    cuda_graphs=None means on exactly when batch_buckets are given and the target is on a CUDA
    device: graphs replay fixed batch sizes, and only CUDA has them. `options` are the other
    EngineConfig fields (fused_attention, stage_timing, context_bucket)."""
    if cuda_graphs is None:
        cuda_graphs = bool(batch_buckets) and target.lm_head.weight.device.type == "cuda"
    config = EngineConfig(max_batch=max_batch, max_context=max_context,
                          max_tree_nodes=max_tree_nodes, batch_buckets=tuple(batch_buckets),
                          cuda_graphs=cuda_graphs, **options)
    if proposer is None and drafter is not None:
        proposer = DFlashProposer(drafter, target)
    return Engine(target, proposer, config)


def as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch.dtype from its name ("bfloat16" or "torch.bfloat16"); a dtype passes through."""
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; give a torch dtype name such as 'bfloat16'")
    return value
