"""The speculation setting to use per concurrency band, for engines that switch it at runtime.

Speculation pays at low load and can lose at high load: an engine that takes a schedule (e.g. a
DDTree budget per batch-size bucket, or vLLM's per-batch speculative-token count) should not run
one setting everywhere. Only the speculation knobs switch at runtime; everything else (layout,
running cap, graphs, memory) is fixed by the launch. So the schedule compares like with like:
trials whose every other parameter equals the chosen configuration's, ranked at each measured
level exactly as ``best`` ranks (the same candidates, SLA and score). At the level ``best`` read
the chosen configuration at, the schedule is that configuration's setting; adjacent levels with
the same choice merge into one band.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from backends.launch_params import SPECULATION_KNOBS as SPECULATION_KEYS
from backends.launch_params import LaunchParams
from tuner.records import TrialRecord
from tuner.selection import Candidate
from tuner.selection import Ranking
from tuner.selection import candidates
from tuner.sla import Limit

LAYOUT_KEYS = ("tp_size", "dp_size", "ep_size", "enable_dp_attention")


def layout_of(launch: LaunchParams) -> dict[str, Any]:
    """The parallelism layout: what takes a different set of GPUs to change."""
    return {k: getattr(launch, k) for k in LAYOUT_KEYS}


def launch_class(launch: LaunchParams) -> dict[str, Any]:
    """Every parameter a running engine cannot switch: all but the speculation knobs."""
    return {f.name: getattr(launch, f.name) for f in fields(launch)
            if f.name not in SPECULATION_KEYS}


def setting_of(launch: LaunchParams) -> dict[str, Any]:
    """The speculation knobs that apply to ``launch``'s method."""
    if launch.is_ddtree:
        return {**{k: getattr(launch, k) for k in SPECULATION_KEYS},
                "speculative_ddtree_max_depth": launch.tree_depth}  # what the tree reaches
    return {k: getattr(launch, k) for k in SPECULATION_KEYS[:2 if launch.speculative else 1]}


def budget_schedule(trials: Sequence[TrialRecord], chosen: Candidate, limits: Sequence[Limit],
                    ranking: Ranking = Ranking(),
                    unusable: Callable[[TrialRecord], str | None] = lambda t: None
                    ) -> dict[str, Any]:
    lp = chosen.trial.launch
    fixed = launch_class(lp)
    same = [t for t in trials if t.launch is not None and launch_class(t.launch) == fixed
            and unusable(t) is None]
    at_level = Ranking(min_runs=ranking.min_runs, penalty=ranking.penalty,
                       prior_rel_sd=ranking.prior_rel_sd, gated_only=ranking.gated_only)
    bands: list[dict[str, Any]] = []
    for c in sorted({c for t in same if t.ok for c in t.measurements}):
        pick = chosen if c == chosen.concurrency else _best_at(same, c, limits, at_level)
        if pick is None:
            continue
        setting = setting_of(pick.trial.launch)
        if bands and _setting(bands[-1]) == setting:
            bands[-1]["max_concurrency"] = c
        else:
            bands.append({"min_concurrency": c, "max_concurrency": c, **setting,
                          "output_tok_s": {}, "trial": {}})
        bands[-1]["output_tok_s"][str(c)] = pick.throughput
        bands[-1]["trial"][str(c)] = pick.trial.trial_number
    return {"layout": layout_of(lp), "launch": {k: v for k, v in fixed.items()
                                                if k not in LAYOUT_KEYS},
            "sla": [str(limit) for limit in limits], "bands": bands, "trials_used": len(same)}


def _best_at(trials: Sequence[TrialRecord], level: int, limits: Sequence[Limit],
             ranking: Ranking) -> Candidate | None:
    """What ``best`` would choose at ``level`` among ``trials`` (score first, then the faster
    single stream, then the earlier trial)."""
    cands = [c for c in candidates(trials, level, limits, ranking)
             if c.runs >= ranking.min_runs and (c.gated or not ranking.gated_only)]
    return max(cands, key=lambda c: (c.score, c.per_user, -c.trial.trial_number), default=None)


def _setting(band: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in band.items() if k in SPECULATION_KEYS}
