"""The performance model's efficiency constants: the only numbers fitted to measurements.

Everything else in the model is a catalog fact (bandwidth, FLOP/s, link speed, parameter counts)
or a fixed, documented assumption (below). Four constants, each one physical effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import fields
from dataclasses import replace

# Fixed assumptions (not fitted).
COMPUTE_EFFICIENCY = 0.7  # achieved / datasheet dense tensor throughput on large GEMMs
KERNELS_PER_LAYER = 15  # eager launches per transformer layer (norms, GEMMs, attention, collectives)
KERNELS_PER_FORWARD = 20  # embedding, LM head, sampling, metadata copies
TREE_BUILD_KERNELS = 30  # DDTree on-device best-first build
GRAPH_REPLAY_LAUNCHES = 16  # a graph replay plus per-step scheduler work, in eager-launch units
MATMULS_PER_ATTENTION = 4  # weight matrices an attention block reads (fused where engines fuse)
RUNTIME_RESERVE_GIB = 2.0  # CUDA context, NCCL buffers, allocator slack outside the static pool
CHUNKED_PREFILL_TOKENS = 8192  # engines' default prefill chunk; sizes the activation workspace


@dataclass(slots=True, frozen=True)
class Efficiency:
    """Fitted constants. Defaults are a neutral start; ``calibrate`` refits them."""

    # Achieved fraction of datasheet memory bandwidth when streaming weights and KV.
    bandwidth_efficiency: float = 0.6
    # Fixed cost of one collective (all-reduce / all-gather) across the TP group, microseconds.
    collective_latency_us: float = 30.0
    # Host time per kernel launch when running eagerly (Python + launch), microseconds.
    launch_overhead_us: float = 25.0
    # Fixed cost of each weight matrix a GPU reads in a step (kernel tail, tile quantisation), us.
    matmul_fixed_us: float = 0.5

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"{f.name} must be > 0")
        if self.bandwidth_efficiency > 1:
            raise ValueError("bandwidth_efficiency must be <= 1")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def with_values(self, **values: float) -> Efficiency:
        return replace(self, **values)

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.names()}
