"""What one nightly run measures: the incumbent, the same layout without speculation, and a few
neighbours of the incumbent that differ in one knob."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from backends.launch_params import SPECULATION_KNOBS, InvalidParams, LaunchParams
from tuner.study import BASELINE

INCUMBENT, BASELINE_ROLE, NEIGHBOUR = "incumbent", "baseline", "neighbour"
_DEFAULTS = LaunchParams()
_SPECULATION = SPECULATION_KNOBS[1:]  # what a method that is not none reads
_TREE = _SPECULATION[1:]
_GRAPHS = ("cuda_graph_max_bs", "cuda_graph_bs_ladder")


@dataclass(slots=True, frozen=True)
class Probe:
    role: str
    params: dict[str, Any]  # as the study recorded them (its records and keys use these)
    launch: LaunchParams  # the same, parsed: what the backend is given
    repeats: int
    change: str = ""  # how a neighbour differs from the incumbent, e.g. "block size 3 -> 4"

    @classmethod
    def of(cls, role: str, params: dict[str, Any], repeats: int, change: str = "") -> Probe:
        return cls(role, params, LaunchParams.from_params(params), repeats, change)

    @property
    def key(self) -> str:
        return config_key(self.launch)

    @property
    def label(self) -> str:
        return self.launch.label()


def canonical(lp: LaunchParams) -> dict[str, Any]:
    """Every LaunchParams field, with knobs that do nothing in this configuration at their
    defaults, so that one configuration has one key whatever the sampler left in its dict."""
    idle = [*(_SPECULATION if not lp.speculative else _TREE if not lp.is_ddtree else ()),
            *(_GRAPHS if not lp.cuda_graph else ())]
    return asdict(replace(lp, **{name: getattr(_DEFAULTS, name) for name in idle}))


def config_key(lp: LaunchParams) -> str:
    text = json.dumps(canonical(lp), sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def baseline_of(params: dict[str, Any]) -> dict[str, Any]:
    """The incumbent's layout with speculation off: what speculation is judged against."""
    return {**params, **BASELINE}


def _moves(lp: LaunchParams, max_block: int) -> list[tuple[str, dict[str, Any]]]:
    """One-knob moves as (what changes, the new values): speculation's knobs first, as these are
    what an engine or drafter update shifts most; validity is checked by the caller."""
    moves: list[tuple[str, dict[str, Any]]] = []
    if lp.speculative:
        b = lp.speculative_dflash_block_size
        moves += [(f"block size {b} -> {v}", {"speculative_dflash_block_size": v})
                  for v in (b + 1, b - 1)]
    if lp.is_ddtree:
        budget, width = lp.speculative_ddtree_budget, lp.tree_width
        moves += [(f"tree budget {budget} -> {v}", {"speculative_ddtree_budget": v})
                  for v in (budget * 2, budget // 2)]
        moves += [(f"tree top-k {width} -> {v}", {"speculative_ddtree_topk": v})
                  for v in (width + 1, width - 1)]
    cap = lp.max_running_requests
    moves += [(f"running cap {cap} -> {v}", {"max_running_requests": v})
              for v in (cap * 2, cap // 2)]
    if lp.is_ddtree:  # is the tree still worth it over DFlash's chain?
        moves.append(("algorithm ddtree -> dflash", {"speculative_algorithm": "dflash"}))
    if not lp.speculative and max_block >= 2:  # does speculation pay now (a new drafter)?
        moves.append((f"algorithm none -> dflash b{max_block}", {
            "speculative_algorithm": "dflash", "speculative_dflash_block_size": max_block}))
    return moves


def neighbours(incumbent: Probe, max_block: int,
               usable: Callable[[LaunchParams], bool] = lambda lp: True) -> list[Probe]:
    """Valid one-knob variations of the incumbent (repeats filled in by :func:`plan`)."""
    params, lp = incumbent.params, incumbent.launch
    seen = {config_key(lp), config_key(replace(lp, **BASELINE))}
    found = []
    for change, values in _moves(lp, max_block):
        candidate = _moved(params, lp, values)
        if candidate is None or not _fits(candidate[1], max_block) or not usable(candidate[1]):
            continue
        if (key := config_key(candidate[1])) not in seen:
            seen.add(key)
            found.append(Probe(NEIGHBOUR, *candidate, 0, change))
    return found


def plan(incumbent: dict[str, Any], max_block: int, repeats: int, explore: int, rotation: int,
         usable: Callable[[LaunchParams], bool] = lambda lp: True) -> list[Probe]:
    """Incumbent first (it decides the exit code), then the baseline, then ``explore``
    neighbours. ``rotation`` (runs so far) shifts which neighbours are taken, so that a week of
    nightly runs covers them all instead of re-measuring the same two."""
    probes = [Probe.of(INCUMBENT, incumbent, repeats)]
    if probes[0].launch.speculative:  # else the incumbent is the baseline
        probes.append(Probe.of(BASELINE_ROLE, baseline_of(incumbent), repeats))
    near = neighbours(probes[0], max_block, usable)
    fewer = max(1, (repeats + 1) // 2)  # cheaper; 3 of 5 still joins the noise pool
    for i in range(min(explore, len(near))):
        probes.append(replace(near[(rotation * explore + i) % len(near)], repeats=fewer))
    return probes


def _moved(params: dict[str, Any], lp: LaunchParams, values: dict[str, Any]
           ) -> tuple[dict[str, Any], LaunchParams] | None:
    """The moved configuration, as a dict and parsed; None when the move makes it invalid."""
    moved = {**params, **values}
    follows = lp.cuda_graph and lp.cuda_graph_max_bs == lp.max_running_requests
    if "max_running_requests" in values and follows:
        # The space derives the graph cap from the running cap.
        moved["cuda_graph_max_bs"] = values["max_running_requests"]
    if values.get("speculative_algorithm") == "dflash":
        moved = {k: v for k, v in moved.items() if k not in _TREE}  # a chain has no tree knobs
    try:
        return moved, LaunchParams.from_params(moved)
    except InvalidParams:
        return None


def _fits(lp: LaunchParams, max_block: int) -> bool:
    return not lp.speculative or lp.speculative_dflash_block_size <= max_block
