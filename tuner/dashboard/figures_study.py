"""Study views: parameter importance, failures by class, nightly history."""

from __future__ import annotations

import plotly.graph_objects as go

from tuner.dashboard.analysis import failure_counts
from tuner.dashboard.data import TrialView
from tuner.dashboard.figures import Panel
from tuner.dashboard.figures import esc
from tuner.dashboard.figures import layout
from tuner.dashboard.importance import Importance
from tuner.dashboard.nightly import NightlyHistory
from tuner.dashboard.nightly import verdict
from tuner.dashboard.nightly import when

SHOWN_METRICS = 8  # more nightly metrics start hidden (a legend click shows them)
VERDICT_COLORS = {"ok": "#2ca02c", "regression": "#d62728", "error": "#ff7f0e",
                  "running": "#999999"}
HOVER_CHARS = 200


def importance(result: Importance) -> Panel:
    if not result.by_objective:
        return Panel(note=result.note)
    fig = go.Figure()
    for objective, values in result.by_objective.items():
        params = list(values)[::-1]  # the most important on top
        fig.add_trace(go.Bar(y=[esc(p) for p in params], x=[values[p] for p in params],
                             name=esc(objective), orientation="h"))
    height = 120 + 28 * max(len(v) for v in result.by_objective.values())
    return Panel(layout(fig, height=max(height, 300), barmode="group",
                        xaxis_title="importance (share of explained variance)",
                        yaxis=dict(automargin=True)), result.note)


def failures(trials: list[TrialView]) -> Panel:
    counts = failure_counts(trials)
    if not counts:
        return Panel(note="no trials recorded yet")
    statuses = list(counts)
    fig = go.Figure(go.Bar(
        x=[esc(s) for s in statuses], y=[counts[s] for s in statuses],
        marker_color=["#2ca02c" if s == "ok" else "#d62728" for s in statuses],
        hovertemplate="%{x}: %{y} trials<extra></extra>"))
    return Panel(layout(fig, height=360, xaxis_title="status", yaxis_title="trials"))


def nightly(history: NightlyHistory) -> Panel:
    if not history.metrics:
        return Panel(note=history.note or "the nightly runs recorded no numeric metric")
    rows = history.rows
    xs = [when(r, i) for i, r in enumerate(rows)]
    # Throughputs share an axis; spreads and tolerances (other units) start hidden.
    shown = [m for m in history.metrics if "median" in m or "tok_s" in m] or history.metrics
    fig = go.Figure()
    for metric in history.metrics:
        spread = "mad" if metric == "median" and "mad" in history.metrics else None
        fig.add_trace(go.Scatter(
            x=xs, y=[r.get(metric) for r in rows], name=esc(metric), mode="lines+markers",
            visible=True if metric in shown[:SHOWN_METRICS] else "legendonly",
            error_y=dict(array=[r.get(spread) or 0 for r in rows]) if spread else None,
            marker=dict(color=[_verdict_color(r) for r in rows], size=9),
            text=[_row_hover(r) for r in rows], hoverinfo="text+y"))
    return Panel(layout(fig, height=420, xaxis_title="nightly run", yaxis_title=_unit(rows)),
                 history.note)


def _unit(rows: list[dict]) -> str:
    """The metric the runs judged (one name, e.g. output_tok_s@128), if they agree."""
    names = {str(r["metric"]) for r in rows if r.get("metric")}
    return esc(names.pop()) if len(names) == 1 else "value"


def _verdict_color(row: dict) -> str:
    return VERDICT_COLORS.get(verdict(row).lower(), "#636efa")


def _row_hover(row: dict) -> str:
    facts = (row.get("created_at"), row.get("config_label"), verdict(row),
             str(row.get("message") or "")[:HOVER_CHARS])
    return "<br>".join(esc(value) for value in facts if value)
