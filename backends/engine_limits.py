"""What an engine will allocate for a speculation setting, worked out from the model configs
before it allocates anything, so that `--budget 100000` is refused with a sentence instead of
growing until the machine runs out of memory.

The estimate follows the engine's own tensors: the static KV caches (target and drafter,
`max_batch x (max_context + nodes)` slots each), and one verify round's temporaries, which grow
with the tree's node count N = budget + 1: the reference attention's fp32 scores over the prefix
and the tree, the LM head's logits, the tree's ancestor mask and its candidate sort. It is an
upper-bound style estimate (temporaries summed although not all live at once), good to a small
factor, which is all a refusal needs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.errors import UserError
from backends.launch_params import InvalidParams

# A verify of more tokens than the longest context costs more than prefilling that context;
# past this many nodes a tree can no longer pay for itself (trees worth tuning hold tens to
# hundreds of nodes). The floor keeps short test prompts from being refused.
MIN_BUDGET_CAP = 1024
FP32, INT64 = 4, 8
GB = 1e9


@dataclass(slots=True, frozen=True)
class Allocation:
    """Bytes an engine needs: its KV caches, and one verify round's temporaries."""

    kv_cache: int
    verify: int

    @property
    def total(self) -> int:
        return self.kv_cache + self.verify


def estimate(target: Any, drafter: Any | None, spec: Any, batch: int, max_context: int,
             elem_bytes: int) -> Allocation:
    """``target``: a ModelConfig or DeepseekConfig; ``drafter``: a DrafterConfig or None;
    ``spec``: a Spec."""
    nodes = spec.num_nodes
    slots = batch * (max_context + nodes)  # cache rows x capacity
    kv = _kv_bytes(target, slots, elem_bytes)
    if drafter is not None:
        kv += _kv_bytes(drafter.layers, slots, elem_bytes)
    width = min(spec.tree_width, target.vocab_size)
    scores = 2 * FP32 * batch * target.num_attention_heads * nodes * (max_context + nodes)
    logits = FP32 * batch * nodes * target.vocab_size
    tree = batch * (2 * nodes * nodes + 3 * INT64 * nodes * width)  # ancestor mask, candidates
    return Allocation(kv, scores + logits + tree)


def _kv_bytes(cfg: Any, slots: int, elem_bytes: int) -> int:
    return cfg.num_hidden_layers * slots * cfg.cached_values_per_token * elem_bytes


class WontFit(UserError):
    """The engine would need more memory than the device has free."""


def check_fits(target: Any, drafter: Any | None, spec: Any, batch: int, max_context: int,
               elem_bytes: int, free_bytes: int) -> None:
    """InvalidParams when the tree budget is past the cap, WontFit when the engine would need
    more memory than ``free_bytes``; each names the knob to lower."""
    check_tree(spec, max_context)
    need = estimate(target, drafter, spec, batch, max_context, elem_bytes)
    if need.total > free_bytes:
        tree = "speculative_ddtree_budget, " if spec.method == "ddtree" else ""
        raise WontFit(
            f"the engine would need about {need.total / GB:.1f} GB (KV cache "
            f"{need.kv_cache / GB:.1f} GB, one verify round {need.verify / GB:.1f} GB) and "
            f"{free_bytes / GB:.1f} GB are free: lower {tree}the running requests, the "
            "prompts or the tokens to generate")


def check_tree(spec: Any, max_context: int) -> None:
    """InvalidParams when the tree budget is past the largest tree worth verifying."""
    cap = max(MIN_BUDGET_CAP, max_context)
    if spec.method == "ddtree" and spec.budget > cap:
        raise InvalidParams(
            f"speculative_ddtree_budget {spec.budget} is past the largest tree the engine "
            f"verifies, {cap} nodes (the larger of {MIN_BUDGET_CAP} and the longest context, "
            f"{max_context} tokens): a bigger verify costs more than prefilling the whole context")


def check_serving_context(max_context: int, positions: int | None, spec: Any) -> None:
    """A server's max_context must hold a prompt token and a whole verify window (less, and
    every request is refused), and no more positions than the target was trained for."""
    check_tree(spec, max_context)  # a tree past the cap: that, not the context, is to change
    least = 1 + spec.num_nodes
    if max_context < least:
        raise UserError(f"--max-context {max_context} is below {least}: a request needs a prompt "
                        f"token and a verify window of {spec.num_nodes} tokens")
    if positions is not None and max_context > positions:
        raise UserError(f"--max-context {max_context} is past the target's "
                        f"max_position_embeddings, {positions}")


def free_memory(device: str) -> int:
    """Bytes the engine could still allocate on ``device``."""
    import torch

    where = torch.device(device)
    if where.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device {device!r}: this machine has no CUDA device")
        return torch.cuda.mem_get_info(where)[0]
    try:  # MemAvailable counts the page cache the kernel would give back
        meminfo = Path("/proc/meminfo").read_text()
        return int(meminfo.split("MemAvailable:")[1].split()[0]) * 1024
    except (OSError, IndexError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
