"""What is being tuned: the node, the model and drafter, and how the engine is launched.

Backends receive a :class:`Deployment`; the tuner builds it from ``tuner.yaml``. Paths in
``target`` are as seen on the serving node (they go into the emitted command), while ``model``
is what the performance model reasons about (a catalog name or a ``config.json``).
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field

from backends.flags import LaunchTarget


@dataclass(slots=True, frozen=True)
class DrafterSpec:
    block_size: int
    num_layers: int
    target_layers: tuple[int, ...]
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate_size: int | None = None
    # Per-position top-1 acceptance given a correct prefix; see perf_model.acceptance.
    acceptance: tuple[float, ...] = (0.77,)
    rank_decay: float = 0.6
    # How the drafter drafts: False, DFlash's one pass over the block; True, a chain drafter
    # (EAGLE-3, MTP) that runs one pass a draft token. The performance model prices either; a
    # chain drafter is how published EAGLE-3 / MTP measurements are described, not a launch
    # the engines' flags render (those say DFlash).
    chain: bool = False


@dataclass(slots=True, frozen=True)
class Deployment:
    gpu: str
    gpus: int
    model: str
    target: LaunchTarget
    drafter: DrafterSpec | None = None
    engine: str = "sglang"
    engine_version: str | None = None
    flag_overrides: dict[str, str | None] = field(default_factory=dict)
    # The performance model prices kernels from the GPU's measured tables (perf_model/kernels)
    # instead of the fitted roofline. The tuner's config resolves its default (null: wherever
    # the GPU has tables, shipped.measured_kernels_for); a Deployment built directly says which.
    measured_kernels: bool = False
