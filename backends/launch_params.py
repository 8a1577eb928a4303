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

from dataclasses import dataclass, fields, replace
from typing import Any

from dflash_core.speculation.spec import METHODS as SPECULATIVE_ALGORITHMS
from dflash_core.speculation.spec import Spec, budget_at_rows, spec_for

GRAPH_LADDERS = ("pow2", "dense")
# The knobs a running engine could switch (everything else is fixed by the launch), in the
# order they depend on each other: the method, its block, then the tree's shape.
SPECULATION_KNOBS = ("speculative_algorithm", "speculative_dflash_block_size",
                     "speculative_ddtree_budget", "speculative_ddtree_topk",
                     "speculative_ddtree_max_depth", "speculative_ddtree_round_tokens")
# What a field's annotation admits (a YAML integer is a fine float; a bool is no integer).
_ADMITS = {"int": (int,), "bool": (bool,), "str": (str,), "float": (int, float)}


class InvalidParams(ValueError):
    """A parameter combination no engine can launch."""


@dataclass(slots=True, frozen=True)
class LaunchParams:
    tp_size: int = 8
    dp_size: int = 1
    ep_size: int = 1
    enable_dp_attention: bool = False
    speculative_algorithm: str = "none"
    # Tokens verified per DFlash step including the anchor (SGLang's meaning of the block size);
    # vLLM's num_speculative_tokens is this minus one.
    speculative_dflash_block_size: int = 8
    # Non-root tree nodes; verify window is budget + 1.
    speculative_ddtree_budget: int = 16
    speculative_ddtree_topk: int = 4
    speculative_ddtree_max_depth: int = 7
    # Verify tokens a round may spend over all its running requests (0 = no cap): with more
    # requests each gets a smaller tree (budget_at_rows), never smaller than the chain.
    speculative_ddtree_round_tokens: int = 0
    cuda_graph: bool = True
    cuda_graph_max_bs: int = 32
    cuda_graph_bs_ladder: str = "dense"
    max_running_requests: int = 48
    mem_fraction_static: float = 0.88

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
        return cls(**params)

    def _check_types(self) -> None:
        wrong = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                 if not _admits(f.type, getattr(self, f.name))]
        if wrong:
            raise InvalidParams("wrongly typed parameter(s): " + ", ".join(wrong))

    def _check_values(self) -> None:
        if self.speculative_algorithm not in SPECULATIVE_ALGORITHMS:
            raise InvalidParams(f"speculative_algorithm must be one of {SPECULATIVE_ALGORITHMS}")
        if self.cuda_graph_bs_ladder not in GRAPH_LADDERS:
            raise InvalidParams(f"cuda_graph_bs_ladder must be one of {GRAPH_LADDERS}")
        for name in ("tp_size", "dp_size", "ep_size", "max_running_requests", "cuda_graph_max_bs"):
            if getattr(self, name) < 1:
                raise InvalidParams(f"{name} must be >= 1")
        if self.tp_size % self.ep_size:
            raise InvalidParams(f"ep_size {self.ep_size} must divide tp_size {self.tp_size}")
        if self.speculative and self.speculative_dflash_block_size < 2:
            raise InvalidParams("speculative_dflash_block_size must be >= 2")
        if self.is_ddtree and self.speculative_ddtree_budget < min_ddtree_budget(
                self.speculative_dflash_block_size):
            raise InvalidParams("speculative_ddtree_budget must be >= block size - 1")
        if self.is_ddtree and min(self.speculative_ddtree_topk, self.speculative_ddtree_max_depth,
                                  self.speculative_ddtree_round_tokens) < 0:
            raise InvalidParams("speculative_ddtree_topk, _max_depth and _round_tokens must be "
                                ">= 0")
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise InvalidParams("mem_fraction_static must be in (0, 1)")

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
    def tree_depth(self) -> int:
        """Draft positions a tree can reach: the drafter predicts block_size - 1 tokens."""
        return min(self.speculative_ddtree_max_depth, self.speculative_dflash_block_size - 1)

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
        return self.is_ddtree and self.speculative_ddtree_round_tokens > 0

    def at_batch(self, batch: int) -> LaunchParams:
        """These parameters as a step over `batch` running requests runs them: a round-capped
        tree's budget at that batch (the engine's Spec.at_rows), the cap dropped."""
        if not self.round_capped:
            return self
        budget = budget_at_rows(self.speculative_ddtree_budget, self.speculative_dflash_block_size,
                                self.speculative_ddtree_round_tokens, batch)
        return replace(self, speculative_ddtree_budget=budget, speculative_ddtree_round_tokens=0)

    @property
    def capture_batch_sizes(self) -> tuple[int, ...]:
        """Decode batch sizes captured as CUDA graphs (empty when graphs are off)."""
        if not self.cuda_graph:
            return ()
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
        if self.is_ddtree:
            parts.append(f"ddtree b{self.speculative_dflash_block_size} "
                         f"B{self.speculative_ddtree_budget} k{self.speculative_ddtree_topk} "
                         f"d{self.tree_depth}" + self.round_label)
        elif self.speculative:
            parts.append(f"dflash b{self.speculative_dflash_block_size}")
        else:
            parts.append("plain")
        parts.append(f"graphs<={max(self.capture_batch_sizes)}" if self.cuda_graph else "eager")
        parts.append(f"run{self.max_running_requests} mem{self.mem_fraction_static:g}")
        return " ".join(parts)

    @property
    def round_label(self) -> str:
        """' r64' for a tree capped at 64 verify tokens a round, '' uncapped."""
        return f" r{self.speculative_ddtree_round_tokens}" if self.round_capped else ""


def min_ddtree_budget(block_size: int) -> int:
    """The smallest tree budget a launch may ask for: room for the whole greedy chain, so a tree
    never verifies less than DFlash would with the same block (the search spaces' lower bound)."""
    return block_size - 1


def to_spec(knobs: Any, trained_block: int | None, spine: bool = False) -> Spec:
    """The engine's Spec for the speculation knobs of ``knobs``: a LaunchParams, or serve's
    options (anything with these attributes; serve's block size may be None = the drafter's
    trained block). The one mapping from the tuning names to the engine's."""
    block = knobs.speculative_dflash_block_size or trained_block
    depth = knobs.speculative_ddtree_max_depth
    return spec_for(knobs.speculative_algorithm, trained_block, block,
                    budget=knobs.speculative_ddtree_budget, topk=knobs.speculative_ddtree_topk,
                    max_depth=min(depth, block - 1) if block else depth, spine=spine,
                    round_tokens=knobs.speculative_ddtree_round_tokens)


def _admits(annotation: str, value: Any) -> bool:
    return (isinstance(value, _ADMITS[annotation])
            and (annotation == "bool" or not isinstance(value, bool)))
