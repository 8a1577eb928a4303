"""The performance model's efficiency constants: the only numbers fitted to measurements.

Everything else in the model is a catalog fact (bandwidth, FLOP/s, link speed, parameter counts)
or a fixed, documented assumption (below). Each fitted constant is one physical effect with
declared physical bounds (``BOUNDS``); a fit that lands on a bound is reported, not trusted.
Which constants may differ between nodes is the hardware class (``fit_classes``): bandwidth
efficiency belongs to the memory kind, collective latency to the interconnect kind; a CPU host's
classes have bounds of their own where its physics differs (``bounds``).
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import fields
from dataclasses import replace

from backends.errors import UserError

# Fixed assumptions (not fitted).
# An eager forward launches every kernel it prices (ModelArch.eager_launches: its GEMMs, grouped
# expert GEMMs and small kernels, and its collectives) and these besides: embedding, sampling,
# metadata copies.
KERNELS_PER_FORWARD = 20
TREE_BUILD_KERNELS = 30  # DDTree on-device best-first build
# A graph replay still costs the scheduler's per-step Python (batch metadata, sampling, output
# bookkeeping), which engines' profiles show as ~0.5-1 ms a step: 16 eager-launch units.
GRAPH_REPLAY_LAUNCHES = 16
# A prefill replayed as CUDA graphs broken at each layer's attention (SGLang's piecewise and
# breakable graphs) launches, a layer: the segment's replay, the KV-cache write, the attention.
PREFILL_GRAPH_BREAK_LAUNCHES = 3
# Launches overlap the GPU only up to the step's one synchronisation: at least this share of the
# host time (scheduling before the first launch, output processing after the sync) is exposed.
EXPOSED_HOST_FLOOR = 0.3
MATMULS_PER_ATTENTION = 4  # weight matrices an attention block reads (fused where engines fuse)
# Small (non-GEMM) kernels of a layer, by block, as engines' decode profiles list them; each costs
# ``kernel_fixed_us`` of GPU time. GQA attention: input norm, q/k norm, RoPE, KV-cache write,
# the attention kernel's own fixed part. MLA (absorbed): input norm, q and kv latent norms, RoPE,
# KV write, attention, the absorbed q and v batched GEMMs. Dense MLP: norm, activation. MoE:
# norm, router top-k, token sort / align, activation, combine; a shared expert adds its
# activation. FP8 checkpoints quantise each distinct GEMM input (attention: GQA 2, MLA 3; an
# MLP or MoE block: 2), one kernel each.
SMALL_KERNELS = {"gqa": 5, "mla": 8, "dense_mlp": 2, "moe": 5, "shared_expert": 1,
                 "fp8_gqa": 2, "fp8_mla": 3, "fp8_mlp": 2}
RUNTIME_RESERVE_GIB = 2.0  # CUDA context, NCCL buffers, allocator slack outside the static pool
CHUNKED_PREFILL_TOKENS = 8192  # engines' default prefill chunk; sizes the activation workspace
# Engines whose scheduler puts new prompts into the decode step's own batch (vLLM: one token
# budget a step, decodes first, prompts in chunks after them). SGLang (without
# --enable-mixed-chunk, its default) and our own engine run the prompts waiting as a prefill
# batch of their own between two decode steps, which the whole running batch waits for.
PREFILL_IN_DECODE_BATCH = frozenset({"vllm"})
# Engines whose forward is torch.compile'd whole (vLLM): no Python runs layer by layer, so an
# eager prefill pays no per-layer host work beyond its launches (``prefill_moe_host_us``).
COMPILED_FORWARD = frozenset({"vllm"})
# Engines whose memory fraction bounds the whole instance (vLLM's gpu_memory_utilization: its
# start-up profile takes the activations, graphs and runtime out of it before sizing the KV
# pool); SGLang's mem_fraction_static holds the weights and KV, the workspace beside it.
WORKSPACE_IN_MEMORY_FRACTION = frozenset({"vllm"})
# A cached K/V element under each kv_cache_dtype, as a share of the catalog's bf16 bytes (auto:
# the model's own dtype, which the catalog prices as bf16; the engines' 8-bit layouts add a
# few scale bytes a token, left out), and the kernel tables' name for that element type.
KV_CACHE_SCALE = {"auto": 1.0, "fp8_e4m3": 0.5, "fp8_e5m2": 0.5}
KV_TABLE_DTYPE = {"auto": "bfloat16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
# Rows at which a tensor-core GEMM reaches half its large-shape efficiency: below a 128-row tile
# the tile is mostly padding, and few tiles cannot fill every SM (wave quantisation). The
# saturating form rows / (rows + GEMM_HALF_ROWS) is the simplest curve with both limits.
GEMM_HALF_ROWS = 64

# Constants whose physical value may be 0 (work some engines do not do at all).
_MAY_BE_ZERO = frozenset({"spec_round_us", "spec_request_us", "kernel_fixed_us",
                          "ep_dispatch_us", "prefill_moe_host_us"})

# Physical bounds of each fitted constant (the fit may not leave them).
BOUNDS: dict[str, tuple[float, float]] = {
    "bandwidth_efficiency": (0.3, 0.95),  # streaming kernels reach 60-90% of datasheet
    "collective_latency_us": (2.0, 150.0),  # NVLink all-reduce ~5-20 us, PCIe ~20-100 us
    "launch_overhead_us": (3.0, 80.0),  # a CUDA launch is ~3-5 us; Python dispatch adds more
    "matmul_fixed_us": (0.05, 5.0),  # a kernel's tail and prologue, a few us at most
    "compute_efficiency": (0.2, 0.9),  # large bf16 GEMMs reach 60-80% of datasheet
    # Verify bookkeeping, accept, KV commit, the drafter's launches, and the scheduler's Python
    # between the round's synchronisations when it does not overlap them: SGLang's DFlash
    # without the overlap scheduler rounds in 7.6 ms where its bytes and FLOPs need ~4.3 ms,
    # and the overlap scheduler alone took ~2 ms a round off (Qwen3-8B on B200, 846 -> 1162
    # tok/s at the same accept length: sglang pull request #23000). Up to 6 ms.
    "spec_round_us": (0.0, 6000.0),
    "spec_request_us": (0.0, 300.0),  # the same work per running request (accept walk, KV slots)
    # A small kernel (a norm, RoPE, a top-k) runs ~2-5 us on the GPU even inside a graph
    # (ramp-up, one wave, tail, the gap to the next); unfused engines or Python-side glue
    # kernels may reach ~20 us.
    "kernel_fixed_us": (0.0, 20.0),
    # Expert parallelism outside the MoE kernel, per MoE layer and step: the token permutation
    # and gather around the experts, the expert-location metadata, the extra synchronisation.
    # A kernel table times the grouped GEMMs alone; the user's node runs EP8 at one request a
    # third slower than TP8 (66 vs 97.9 tok/s) on the same bytes. Up to 200 us a layer.
    "ep_dispatch_us": (0.0, 200.0),
    # Host work of an eager prefill per MoE layer beyond its launches (the routing's and the
    # experts' Python, their synchronisations). SGLang's one-request TTFTs of MLA + MoE models
    # stay ~130-200 ms from 128 to 4,096 prompt tokens, several times their kernels' time: such
    # a prefill is host-bound. Up to 5 ms a layer.
    "prefill_moe_host_us": (0.0, 5000.0),
}


@dataclass(slots=True, frozen=True)
class Efficiency:
    """Fitted constants of one node. Defaults are a neutral start; ``calibrate`` refits them."""

    # Achieved fraction of datasheet memory bandwidth when streaming weights and KV.
    bandwidth_efficiency: float = 0.6
    # Fixed cost of one collective (all-reduce / all-gather / all-to-all) across a group, us.
    collective_latency_us: float = 30.0
    # Host time per kernel launch when running eagerly (Python + launch), microseconds.
    launch_overhead_us: float = 25.0
    # Fixed cost of each weight matrix a GPU reads in a step (kernel tail, tile quantisation), us.
    matmul_fixed_us: float = 0.5
    # Achieved / datasheet dense tensor throughput on large GEMMs (small ones get less, see
    # GEMM_HALF_ROWS).
    compute_efficiency: float = 0.7
    # Host work of one speculative round beyond the drafter's and verifier's bytes and FLOPs:
    # the accept walk, KV commit / rollback, the drafter's own launch sequence and the extra
    # host-device synchronisation (us, per round, whatever the batch). Serial, or hidden behind
    # the GPU where the engine overlaps rounds (predict._round_work).
    spec_round_us: float = 0.0
    # The part of that work done per running request each round (its accept walk, its KV slots
    # committed or rolled back, its output tokens appended): us per request per round.
    spec_request_us: float = 0.0
    # GPU time of one of the small kernels between a layer's GEMMs (norms, RoPE, activation, the
    # MoE router, its top-k and token permutation, FP8 activation quantisation: counted per
    # architecture by ``small_kernels``), which neither bytes nor FLOPs account for: a few us
    # of ramp-up and tail each, graphs or not. The kernel library decides it, so it is fitted
    # per engine family (us per kernel). The default is the physical ~3 us of such a kernel.
    kernel_fixed_us: float = 3.0
    # GPU time of expert parallelism outside the MoE kernel, per MoE layer and step when
    # ep_size > 1 (us).
    ep_dispatch_us: float = 0.0
    # Host time an eager prefill spends per MoE layer beyond its launches (us). It overlaps the
    # prefill's GPU time, so it shows where prompts are short and the GPU is fast. The engine's
    # code decides it, so it is fitted per engine family; identified by median TTFTs.
    prefill_moe_host_us: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value < 0 or (value == 0 and f.name not in _MAY_BE_ZERO):
                raise UserError(f"{f.name} must be > 0")
        if self.bandwidth_efficiency > 1 or self.compute_efficiency > 1:
            raise UserError("bandwidth_efficiency and compute_efficiency must be <= 1")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def with_values(self, **values: float) -> Efficiency:
        return replace(self, **values)

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.names()}


# Memory kind of a CPU host (hardware.yaml): it computes on the cores that dispatch the work.
CPU_MEMORY = "dram"
CPU = "cpu"  # the class of every host and compute constant of a CPU host (fit_classes)

# Bounds that differ on a CPU host, where physics does; every other constant keeps BOUNDS.
CPU_BOUNDS: dict[str, tuple[float, float]] = {
    # No driver call and no launch queue: an ATen CPU kernel dispatched from Python costs
    # ~1-3 us of dispatcher, one inside a compiled graph (vLLM's inductor C++) a function
    # call, well under 1 us. The GPU's 3 us floor is a CUDA launch's.
    "launch_overhead_us": (0.3, 80.0),
    # The round's bookkeeping (tree build, accept walk, KV commit and rollback) that a GPU runs
    # for all requests at once, one thread block each, runs request after request on a core:
    # what bounds a GPU's per-round cost (6 ms, above) bounds a CPU's per-request one.
    "spec_request_us": (0.0, 6000.0),
}


def bounds(name: str, klass: str) -> tuple[float, float]:
    """The physical bounds of constant ``name`` in hardware class ``klass``."""
    if klass.endswith(CPU) and name in CPU_BOUNDS:
        return CPU_BOUNDS[name]
    return BOUNDS[name]


def fit_classes(memory: str, interconnect: str, engine: str) -> dict[str, str]:
    """The hardware class each constant is shared within: a global fit keeps one value per
    class, so PCIe's collective latency is never used on NVLink, nor GDDR7's efficiency on HBM.
    The launch overhead is shared by all GPU hosts; the small-kernel time belongs to the engine
    family whose kernels run (SGLang's and vLLM's differ), and so does the speculation round's
    own work (its scheduler, accept path and KV bookkeeping are the engine's code): a family no
    fitted source speculates on keeps the neutral 0, its rounds costing their kernels and
    launches only. A CPU host's are its own (class ``cpu``, ``<family>-cpu``): its launches,
    per-round work, GEMMs and small ops run on the cores, not behind a GPU."""
    family = engine_family(engine)
    if memory == CPU_MEMORY:
        host = compute = CPU
        family = f"{family}-{CPU}"
    else:
        host, compute = "host", "gpu"
    return {"bandwidth_efficiency": memory, "collective_latency_us": _link_family(interconnect),
            "launch_overhead_us": host, "matmul_fixed_us": compute,
            "compute_efficiency": compute, "spec_round_us": family, "spec_request_us": family,
            "kernel_fixed_us": family, "ep_dispatch_us": family,
            "prefill_moe_host_us": family}


def engine_family(engine: str) -> str:
    """vLLM (any version) or SGLang; dflash_core's own engine counts as SGLang's family (its
    flags and kernels follow SGLang's)."""
    return "vllm" if engine.lower().startswith("vllm") else "sglang"


def _link_family(interconnect: str) -> str:
    return "nvlink" if interconnect.startswith("nvlink") else interconnect
