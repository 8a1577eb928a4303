"""Tiny random fp32 models and engines for the dflash_core tests (built here, never downloaded)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dflash_core import (
    AcceptanceProfile,
    DFlashProposer,
    Drafter,
    DrafterConfig,
    Engine,
    EngineConfig,
    ModelConfig,
    OracleProposer,
    SamplingParams,
    Target,
)

VOCAB = 48
MASK_TOKEN = VOCAB - 1
BLOCK = 6


def target_config(moe: bool = False, **overrides) -> ModelConfig:
    fields = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=10_000.0)
    if moe:
        fields.update(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16,
                      mlp_only_layers=[0])
    fields.update(overrides)
    return ModelConfig(**fields)


def drafter_config(block_size: int = BLOCK, **overrides) -> DrafterConfig:
    fields = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=10_000.0)
    return DrafterConfig(ModelConfig(**fields | overrides), block_size, [0, 2], MASK_TOKEN)


def make_target(moe: bool = False, seed: int = 0, **overrides) -> Target:
    torch.manual_seed(seed)
    target = Target(target_config(moe, **overrides)).eval()
    # Larger embeddings make the tiny model's next-token choices decisive (no fp32 near-ties).
    with torch.no_grad():
        target.model.embed_tokens.weight.mul_(2.0)
    return target


def make_drafter(seed: int = 1, block_size: int = BLOCK) -> Drafter:
    torch.manual_seed(seed)
    return Drafter(drafter_config(block_size)).eval()


def make_engine(target: Target, proposer=None, batch: int = 4, nodes: int = 64,
                **config) -> Engine:
    """`config`: other EngineConfig fields (batch_buckets, ...)."""
    return Engine(target, proposer, EngineConfig(max_batch=batch, max_context=160,
                                                 max_tree_nodes=nodes, **config))


def dflash_engine(moe: bool = False, batch: int = 4) -> Engine:
    target = make_target(moe)
    return make_engine(target, DFlashProposer(make_drafter(), target), batch)


PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19], [3]]


def oracle_engine(profile: AcceptanceProfile, seed: int = 0,
                  **config) -> tuple[Engine, list[list[int]]]:
    """An engine whose oracle drafts the target's own greedy continuation of PROMPTS, accepted
    as `profile` says (deep, unlike a random drafter), and those continuations (60 tokens)."""
    target = make_target()
    references = make_engine(target).generate(PROMPTS, SamplingParams(max_tokens=60)).tokens
    full = [p + r for p, r in zip(PROMPTS, references)]
    oracle = OracleProposer(full, VOCAB, BLOCK, profile, seed=seed)
    return make_engine(target, oracle, **config), references


# --- host-sync detection ----------------------------------------------------------------------

# Ops that read device data on the host or size their output by it (a CUDA graph cannot hold
# them). bincount is here because its CUDA kernel reads max() back to size the output.
HOST_SYNC_OPS = frozenset({
    "aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.lift_fresh",
    "aten._unique", "aten._unique2", "aten.unique_dim", "aten.unique_consecutive", "aten.bincount",
})


class _OpRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name in ("aten.index", "aten.index_put", "aten.index_put_") and _has_bool_index(args):
            name += "[bool]"  # boolean-mask indexing: a nonzero inside
        self.ops.add(name)
        return func(*args, **(kwargs or {}))


def _has_bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


def host_sync_ops(fn) -> set[str]:
    """The host-syncing or data-dependent-shape ops `fn()` dispatched (empty when it has none).

    `.tolist()` and `.numpy()` bypass the dispatcher on CPU: run on meta tensors to catch those."""
    with _OpRecorder() as recorder:
        fn()
    return {op for op in recorder.ops if op in HOST_SYNC_OPS or op.endswith("[bool]")}
