"""The typed parameters of one launch, shared by every backend, flag dialect and the model.

Parameter names follow the SGLang flag they control (``ep_size`` -> ``--ep-size``), so one name
means one thing from the search space to the emitted command. Parameters a search space leaves
out take the defaults below, which match what a plain launch of the engine would do.

A trial's flat parameter dict is parsed once, where it enters the tuner
(:meth:`LaunchParams.from_params`); a LaunchParams is valid by construction. The engine spells
the speculation knobs without their prefix (``speculative_ddtree_topk`` -> ``Spec.topk``);
:func:`to_spec` is the one place the two vocabularies meet.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from backends.contract import MAX_CONCURRENCY
from backends.errors import UserError
from dflash_core.speculation.spec import METHODS as SPECULATIVE_ALGORITHMS
from dflash_core.speculation.spec import (Spec, budget_at_rows, check_tree_caps, spec_for,
                                          tree_shape)

GRAPH_LADDERS = ("pow2", "dense")
# vLLM's --compilation-config cudagraph_mode values we tune (its default first).
CUDAGRAPH_MODES = ("FULL_AND_PIECEWISE", "PIECEWISE", "NONE")
# NCCL's values, as its environment-variable documentation spells them (None: NCCL chooses).
NCCL_PROTOS = ("LL", "LL128", "Simple")
NCCL_P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")  # LOC: peer-to-peer off
# The KV cache's element type: the model's own (auto), or one of the 8-bit floats SGLang and
# vLLM both spell this way (--kv-cache-dtype).
KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2")
# The knobs a running engine could switch (everything else is fixed by the launch), in the
# order they depend on each other: the method, its block, then the tree's shape.
SPECULATION_KNOBS = ("speculative_algorithm", "speculative_dflash_block_size",
                     "speculative_ddtree_budget", "speculative_ddtree_topk",
                     "speculative_ddtree_max_depth", "speculative_ddtree_round_tokens",
                     "speculative_ddtree_spine")
# The knobs the performance model cannot price: it predicts a configuration as if they were at
# their defaults (`LaunchParams.priced`), so only a measurement on the engine can tell them apart.
MEASURED_ONLY = frozenset({"disable_custom_all_reduce", "nccl_proto", "nccl_p2p_level",
                           "cudagraph_mode"})
# What a field's annotation admits (a YAML integer is a fine float; a bool is no integer).
_ADMITS = {"int": (int,), "bool": (bool,), "str": (str,), "float": (int, float),
           "tuple[int, ...]": (tuple,)}


class InvalidParams(UserError):
    """A parameter combination no engine can launch."""


def _knob(default: Any, help: str) -> Any:
    """A field with its command-line help (the engine and estimate options are made from it)."""
    return field(default=default, metadata={"help": help})


@dataclass(slots=True, frozen=True)
class LaunchParams:
    tp_size: int = _knob(8, "Tensor-parallel ranks the target is split over (attention heads, "
                            "MLPs, vocabulary).")
    dp_size: int = _knob(1, "Data-parallel replicas of the tp group.")
    ep_size: int = _knob(1, "Expert groups among the tp ranks (divides tp_size): routed experts "
                            "split over them.")
    enable_dp_attention: bool = _knob(False, "Attention data-parallel over the tp group.")
    decode_context_parallel_size: int = _knob(
        1, "Ranks of the tp group the decode KV cache is split over by context (divides "
           "tp_size); more KV capacity, an extra collective a layer (vLLM).")
    disable_custom_all_reduce: bool = _knob(
        False, "Use NCCL instead of the engine's custom all-reduce kernel (which needs "
               "peer-to-peer access between the GPUs to be fast).")
    nccl_proto: str | None = _knob(None, "NCCL_PROTO for the launch: LL, LL128 or Simple "
                                         "(default: unset, NCCL chooses).")
    nccl_p2p_level: str | None = _knob(
        None, "NCCL_P2P_LEVEL for the launch: LOC (peer-to-peer off), NVL, PIX, PXB, PHB or SYS "
              "(default: unset, NCCL chooses from the topology).")
    speculative_algorithm: str = _knob("none", "Speculation method: none, dflash or ddtree.")
    # SGLang's meaning of the block size; vLLM's num_speculative_tokens is this minus one.
    speculative_dflash_block_size: int = _knob(8, "DFlash block: tokens verified per round, "
                                                  "anchor included (at most the drafter's).")
    speculative_ddtree_budget: int = _knob(16, "DDTree node budget (root excluded); a round "
                                               "verifies budget + 1 tokens a request.")
    # None is "no cap" for the three tree caps; `tree_width` / `tree_depth` resolve them.
    speculative_ddtree_topk: int | None = _knob(None, "DDTree candidates per depth (default: no "
                                                      "cap, as many as the budget).")
    speculative_ddtree_max_depth: int | None = _knob(None, "DDTree max depth (default: no cap, "
                                                           "block size - 1).")
    speculative_ddtree_round_tokens: int | None = _knob(
        None, "DDTree verify tokens a round may spend over all its requests (default: no cap); "
              "at higher load each tree shrinks to round-tokens / requests - 1 nodes, never "
              "below block size - 1.")
    speculative_ddtree_spine: bool = _knob(False, "DDTree: the greedy chain goes in first (never "
                                                  "accepts less than DFlash; our engine only).")
    cuda_graph: bool = _knob(True, "Capture decode steps as CUDA graphs.")
    cudagraph_mode: str = _knob(CUDAGRAPH_MODES[0], "vLLM's CUDA-graph mode with graphs on: "
                                                    "FULL_AND_PIECEWISE, PIECEWISE or NONE "
                                                    "(compiled, no graphs).")
    cuda_graph_max_bs: int = _knob(32, "Largest decode batch captured as a graph.")
    cuda_graph_bs_ladder: str = _knob("dense", "Captured batch sizes below the max: pow2 or "
                                               "dense (1, 2, 4, then every 8).")
    cuda_graph_bs: tuple[int, ...] | None = _knob(
        None, "Captured decode batch sizes, e.g. 1,2,4,8: rounds run padded to these sizes and, "
              "on a CUDA device, replay captured graphs (with --compile, one compiled graph a "
              "size). Without it: the ladder up to cuda_graph_max_bs.")
    max_running_requests: int = _knob(48, "Requests in the running batch (continuous "
                                          "batching).")
    mem_fraction_static: float = _knob(
        0.88, "Share of GPU memory for weights and KV cache (vLLM's gpu_memory_utilization: "
        "the activations too).")
    kv_cache_dtype: str = _knob(
        "auto", "KV cache element type: auto (the model's, bf16), fp8_e4m3 or fp8_e5m2 (half "
                "the bytes a token: twice the cached tokens; K and V are rounded to 8 bits, so "
                "answers can differ from auto's).")

    def __post_init__(self) -> None:
        self._check_types()
        self._check_values()

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> LaunchParams:
        """Parse a trial's flat parameter dict (names as in the search space); InvalidParams
        names what is wrong."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise InvalidParams(f"unknown parameter(s): {', '.join(unknown)}")
        sizes = params.get("cuda_graph_bs")
        if isinstance(sizes, list):  # JSON and YAML have lists, not tuples
            params = {**params, "cuda_graph_bs": tuple(sizes)}
        return cls(**params)

    def _check_types(self) -> None:
        wrong = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                 if not _admits(f.type, getattr(self, f.name))]
        if wrong:
            raise InvalidParams("wrongly typed parameter(s): " + ", ".join(wrong))

    def _check_values(self) -> None:
        if self.speculative_algorithm not in SPECULATIVE_ALGORITHMS:
            raise InvalidParams(f"speculative_algorithm must be one of {SPECULATIVE_ALGORITHMS}")
        self._check_choices()
        for name in ("tp_size", "dp_size", "ep_size", "decode_context_parallel_size",
                     "max_running_requests", "cuda_graph_max_bs"):
            if getattr(self, name) < 1:
                raise InvalidParams(f"{name} must be >= 1")
        if self.cuda_graph_max_bs > MAX_CONCURRENCY:  # its ladder of sizes grows with it
            raise InvalidParams(f"cuda_graph_max_bs must be at most {MAX_CONCURRENCY}, "
                                f"got {self.cuda_graph_max_bs}")
        for name in ("ep_size", "decode_context_parallel_size"):
            if self.tp_size % getattr(self, name):
                raise InvalidParams(f"{name} {getattr(self, name)} must divide tp_size "
                                    f"{self.tp_size}")
        if self.speculative and self.speculative_dflash_block_size < 2:
            raise InvalidParams("speculative_dflash_block_size must be >= 2")
        if self.is_ddtree and self.speculative_ddtree_budget < min_ddtree_budget(
                self.speculative_dflash_block_size):
            raise InvalidParams("speculative_ddtree_budget must be >= block size - 1")
        if self.is_ddtree:
            self._check_tree_caps()
        sizes = self.cuda_graph_bs
        if sizes is not None and not (sizes and all(
                type(b) is int and 1 <= b <= MAX_CONCURRENCY for b in sizes)):
            raise InvalidParams(f"cuda_graph_bs must be batch sizes in 1..{MAX_CONCURRENCY}, "
                                f"got {sizes}")
        if not self.cuda_graph and self.cudagraph_mode != CUDAGRAPH_MODES[0]:
            raise InvalidParams(f"cudagraph_mode={self.cudagraph_mode} needs cuda_graph on "
                                "(cuda_graph off is eager: no graphs, no compilation)")
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise InvalidParams("mem_fraction_static must be in (0, 1)")

    def _check_choices(self) -> None:
        for name, choices in (("cuda_graph_bs_ladder", GRAPH_LADDERS),
                              ("cudagraph_mode", CUDAGRAPH_MODES),
                              ("nccl_proto", (None, *NCCL_PROTOS)),
                              ("nccl_p2p_level", (None, *NCCL_P2P_LEVELS)),
                              ("kv_cache_dtype", KV_CACHE_DTYPES)):
            if getattr(self, name) not in choices:
                raise InvalidParams(f"{name} must be one of {choices}")

    def _check_tree_caps(self) -> None:
        try:
            check_tree_caps(self.speculative_dflash_block_size, self.speculative_ddtree_topk,
                            self.speculative_ddtree_max_depth,
                            self.speculative_ddtree_round_tokens)
        except ValueError as error:  # the engine's names, without the tuning prefix
            raise InvalidParams("speculative_ddtree_" + str(error).replace(
                "None for no cap", "leave it out (null) for no cap")) from None

    def priced(self, unpriced: frozenset[str] = MEASURED_ONLY) -> LaunchParams:
        """These parameters as the performance model prices them: the knobs it cannot price
        (``unpriced``, MEASURED_ONLY by default) at their defaults."""
        return replace(self, **{f.name: f.default for f in fields(self) if f.name in unpriced})

    def non_default(self) -> dict[str, Any]:
        """The knobs set away from a plain launch's default, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != f.default}

    @property
    def gpus(self) -> int:
        return self.tp_size * self.dp_size

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm != "none"

    @property
    def is_ddtree(self) -> bool:
        return self.speculative_algorithm == "ddtree"

    @property
    def tree_width(self) -> int:
        """Candidates a tree depth may hold, the cap resolved (no cap: the budget)."""
        return self._tree_shape[0]

    @property
    def tree_depth(self) -> int:
        """Draft positions a tree can reach, the cap resolved (no cap: block_size - 1)."""
        return self._tree_shape[1]

    @property
    def _tree_shape(self) -> tuple[int, int]:
        return tree_shape(self.speculative_dflash_block_size, self.speculative_ddtree_budget,
                          self.speculative_ddtree_topk, self.speculative_ddtree_max_depth)

    @property
    def verify_tokens(self) -> int:
        """Tokens the target verifies per request per step (anchor included): the most, at one
        running request (`at_batch` gives a step over more)."""
        if self.is_ddtree:
            return self.speculative_ddtree_budget + 1
        return self.speculative_dflash_block_size if self.speculative else 1

    @property
    def round_capped(self) -> bool:
        """A DDTree whose budget shrinks with the running requests."""
        return self.is_ddtree and self.speculative_ddtree_round_tokens is not None

    def at_batch(self, batch: int) -> LaunchParams:
        """These parameters as a step over `batch` running requests runs them: a round-capped
        tree's budget at that batch (the engine's Spec.at_rows), the cap dropped."""
        if not self.round_capped:
            return self
        budget = budget_at_rows(self.speculative_ddtree_budget, self.speculative_dflash_block_size,
                                self.speculative_ddtree_round_tokens, batch)
        return replace(self, speculative_ddtree_budget=budget,
                       speculative_ddtree_round_tokens=None)

    @property
    def capture_batch_sizes(self) -> tuple[int, ...]:
        """Decode batch sizes captured as CUDA graphs (empty when graphs are off)."""
        if not self.cuda_graph:
            return ()
        if self.cuda_graph_bs is not None:
            return tuple(sorted(set(self.cuda_graph_bs)))
        top = min(self.cuda_graph_max_bs, self.max_running_requests)
        if self.cuda_graph_bs_ladder == "pow2":
            ladder = [1 << i for i in range(top.bit_length())]
        else:  # SGLang-style: small sizes, then every 8.
            ladder = [1, 2, 4] + list(range(8, top + 1, 8))
        return tuple(sorted({b for b in ladder if b <= top} | {top}))

    def label(self) -> str:
        """Short human name, e.g. ``TP8 EP8 dflash b8 graphs<=32 run48 mem0.88``."""
        parts = [f"TP{self.tp_size}" + (f"xDP{self.dp_size}" if self.dp_size > 1 else "")]
        if self.ep_size > 1:
            parts.append(f"EP{self.ep_size}")
        if self.enable_dp_attention:
            parts.append("attnDP")
        if self.decode_context_parallel_size > 1:
            parts.append(f"DCP{self.decode_context_parallel_size}")
        if self.is_ddtree:
            parts.append(f"ddtree b{self.speculative_dflash_block_size} "
                         f"B{self.speculative_ddtree_budget} k{self.tree_width} "
                         f"d{self.tree_depth}" + self.round_label)
        elif self.speculative:
            parts.append(f"dflash b{self.speculative_dflash_block_size}")
        else:
            parts.append("plain")
        parts.append(f"graphs<={max(self.capture_batch_sizes)}" if self.cuda_graph else "eager")
        if self.cudagraph_mode != CUDAGRAPH_MODES[0]:
            parts.append(self.cudagraph_mode.lower())
        parts.append(f"run{self.max_running_requests} mem{self.mem_fraction_static:g}")
        if self.kv_cache_dtype != KV_CACHE_DTYPES[0]:
            parts.append(f"kv-{self.kv_cache_dtype}")
        return " ".join(parts + self._collective_labels())

    def _collective_labels(self) -> list[str]:
        """'no-custom-ar NCCL_PROTO=LL': only what is set away from the engine's default."""
        parts = ["no-custom-ar"] if self.disable_custom_all_reduce else []
        return parts + [f"{name.upper()}={getattr(self, name)}"
                        for name in ("nccl_proto", "nccl_p2p_level") if getattr(self, name)]

    @property
    def round_label(self) -> str:
        """' r64' for a tree capped at 64 verify tokens a round, '' uncapped."""
        return f" r{self.speculative_ddtree_round_tokens}" if self.round_capped else ""


def min_ddtree_budget(block_size: int) -> int:
    """The smallest tree budget a launch may ask for: room for the whole greedy chain, so a tree
    never verifies less than DFlash would with the same block (the search spaces' lower bound)."""
    return block_size - 1


def to_spec(launch: LaunchParams, trained_block: int | None) -> Spec:
    """The engine's Spec for ``launch``'s speculation, its tree caps resolved (the tree the
    performance model prices): the one mapping from the tuning names to the engine's.
    ``trained_block`` is the drafter's (None: no drafter, so only plain decoding)."""
    return spec_for(launch.speculative_algorithm, trained_block,
                    launch.speculative_dflash_block_size, budget=launch.speculative_ddtree_budget,
                    topk=launch.tree_width, max_depth=launch.tree_depth,
                    spine=launch.speculative_ddtree_spine,
                    round_tokens=launch.speculative_ddtree_round_tokens)


def _admits(annotation: str, value: Any) -> bool:
    if annotation.endswith(" | None"):
        return value is None or _admits(annotation.removesuffix(" | None"), value)
    return (isinstance(value, _ADMITS[annotation])
            and (annotation == "bool" or not isinstance(value, bool)))
