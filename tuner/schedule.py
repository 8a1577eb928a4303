"""The speculation setting to use per concurrency band, for engines that switch it at runtime.

Speculation pays at low load and can lose at high load: an engine that takes a schedule (e.g. a
DDTree budget per batch-size bucket, or vLLM's per-batch speculative-token count) should not run
one setting everywhere. From the study's records: at every measured concurrency level, the
speculation setting with the highest median throughput within the SLA among trials that share
the chosen configuration's parallelism layout (what cannot change without a relaunch); adjacent
levels with the same choice merge into one band.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from tuner import stats
from tuner.records import TrialRecord
from tuner.sla import Limit
from tuner.sla import meets

SPECULATION_KEYS = ("speculative_algorithm", "speculative_dflash_block_size",
                    "speculative_ddtree_budget", "speculative_ddtree_topk",
                    "speculative_ddtree_max_depth")
LAYOUT_KEYS = ("tp_size", "dp_size", "ep_size", "enable_dp_attention")


def budget_schedule(trials: Sequence[TrialRecord], chosen: dict[str, Any],
                    limits: Sequence[Limit]) -> dict[str, Any]:
    layout = {k: chosen[k] for k in LAYOUT_KEYS if k in chosen}
    same = [t for t in trials if t.ok and all(t.params.get(k) == v for k, v in layout.items())]
    by_level: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t in same:
        setting = _setting(t.params)
        for c, row in t.measurements.items():
            if meets(row, limits):
                by_level[c][setting].append(row["output_tok_s"])
    bands: list[dict[str, Any]] = []
    for c in sorted(by_level):
        setting, rates = max(by_level[c].items(), key=lambda kv: stats.median(kv[1]))
        if bands and bands[-1]["_key"] == setting:
            bands[-1]["max_concurrency"] = c
            bands[-1]["output_tok_s"][str(c)] = stats.median(rates)
            continue
        bands.append({"_key": setting, "min_concurrency": c, "max_concurrency": c,
                      **json.loads(setting), "output_tok_s": {str(c): stats.median(rates)}})
    for band in bands:
        del band["_key"]
    return {"layout": layout, "sla": [str(limit) for limit in limits], "bands": bands,
            "trials_used": len(same)}


def _setting(params: dict[str, Any]) -> str:
    return json.dumps({k: params[k] for k in SPECULATION_KEYS if k in params}, sort_keys=True)
