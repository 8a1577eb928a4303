"""The best configuration and its Pareto front as one table on stderr: what ``best`` shows and
what ``run`` ends with."""

from __future__ import annotations

from typing import Any

from tuner import render
from tuner.best import BestResult
from tuner.best import find_best
from tuner.config import Config
from tuner.errors import NoResultError


def run_summary(cfg: Config) -> None:
    """What ``run`` ends with: the table ``best`` would show now, or why it cannot choose yet."""
    try:
        result = find_best(cfg, None, None)
    except NoResultError as err:
        render.note(f"nothing to launch yet: {err}", "yellow")
        return
    show_best(result)
    render.note("`dflash-tune best --emit-flags` prints its launch command")


def show_best(result: BestResult) -> None:
    """The front (best first, the chosen one starred), then any warning about the choice."""
    noisy = result.ranking.prior_rel_sd > 0  # measured: medians of runs, ranked by a bound
    at = ("at each configuration's SLA limit" if result.ranking.point == "at_sla_limit"
          else f"at concurrency {result.target_concurrency}")
    columns = ["trial", "", "output\ntok/s" + ("\n(median)" if noisy else "\n(total)"),
               "output\ntok/s\n/GPU", "TTFT\np50\nms", "TPOT\np50\nms", "tok/s\n/user",
               "tok/s\n/user\n@1", "vs\nplain", *(("runs", "score") if noisy else ()),
               "queues"]
    shown = result.front[:result.top]
    sla = ", ".join(map(str, result.limits)) or "none"
    render.table(f"Pareto front {at} (SLA: {sla})", columns,
                 [_row(result, c, noisy) for c in shown], compact=True)
    for c in shown:
        render.note(f"{c.trial.trial_number:>6}  {result.emitter.label(c.trial.launch)}")
    render.note("vs plain: over the fastest plain-decoding configuration of the same layout "
                "at the same concurrency that does not queue; queues: the running cap is below "
                "the concurrency")
    if result.crossover is not None:
        render.note("speculation vs plain (the best configuration of each at each concurrency): "
                    + result.crossover.line())
        if settle := result.crossover.settle_line():
            render.note(settle)
    for warning in result.warnings:
        render.note(f"warning: {warning}", "yellow")
    for line in result.evidence():
        render.note(line, "yellow")


def _row(result: BestResult, c: Any, noisy: bool) -> tuple:
    v = result.view(c)
    speedup = v["speedup_vs_plain"]
    return (v["trial"], "*" if c is result.chosen else "", v["output_tok_s"],
            v["output_tok_s_per_gpu"], _ms(v["ttft_p50_ms"]), _ms(v["tpot_p50_ms"]),
            v["tok_s_per_user"],
            v["tok_s_per_user_at_1"], f"{speedup:.2f}x" if speedup else "-",
            *((v["runs"], v["score_tok_s"]) if noisy else ()), "yes" if v["queueing"] else "")


def _ms(value: float | None) -> float | int | None:
    """Latencies past a second to the millisecond: the decimals only widen the column."""
    return round(value) if value is not None and value >= 1000 else value
