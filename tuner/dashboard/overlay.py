"""Two studies drawn over each other (`dashboard --compare`): a PCIe node against an H200 one,
or one machine before and after an upgrade. The side-by-side numbers are `dflash-tune compare`;
this is the picture of where each one's configurations sit."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from tuner.crossover import best_of
from tuner.dashboard.data import StudyData
from tuner.dashboard.data import load_study_data
from tuner.dashboard.figures import Panel
from tuner.dashboard.figures import esc
from tuner.dashboard.figures import layout
from tuner.dashboard.page import Section
from tuner.dashboard.page import page
from tuner.dashboard.report import header
from tuner.dashboard.report import write_html

STUDY_COLORS = ("#636efa", "#ef553b")


def write_overlay(storage_a: str, study_a: str, study_b: str, storage_b: str | None,
                  out_path) -> Path:
    """The overlay of the two studies written to ``out_path`` (checked before it is built)."""
    return write_html(out_path, lambda: build_overlay(storage_a, study_a, study_b, storage_b))


def build_overlay(storage_a: str, study_a: str, study_b: str, storage_b: str | None = None,
                  refresh_s: int | None = None) -> str:
    a, b = load_study_data(storage_a, study_a), load_study_data(storage_b or storage_a, study_b)
    sections = [Section("pareto", "Pareto fronts", _PARETO, pareto_overlay(a, b)),
                Section("concurrency", "Best throughput vs concurrency", _CONCURRENCY,
                        concurrency_overlay(a, b))]
    return page(f"dflash-tune: {a.name} vs {b.name}", header(a) + header(b), sections,
                refresh_s)


def pareto_overlay(a: StudyData, b: StudyData) -> Panel:
    fig = go.Figure()
    for data, color in zip((a, b), STUDY_COLORS, strict=True):
        for trace in _pareto_traces(data, color):
            fig.add_trace(trace)
    if not fig.data:
        return Panel(note="neither study has a successful trial measured at both levels")
    return Panel(layout(fig, xaxis_title="tok/s per user at concurrency 1",
                        yaxis_title="output tok/s per GPU at each study's target concurrency"))


def _pareto_traces(data: StudyData, color: str) -> list[go.Scatter]:
    target, name = data.target, esc(data.name)
    feasible = [t for t in data.ok_trials if t.feasible]

    def trace(ts, label: str, **style) -> go.Scatter:
        return go.Scatter(x=[t.metric(1, "tok_s_per_user") for t in ts],
                          y=[t.metric(target, "output_tok_s_per_gpu") for t in ts],
                          name=f"{name}: {label}", text=[esc(t.label) for t in ts],
                          hoverinfo="text+x+y", **style)

    traces = [trace(feasible, f"meets its SLA (c={target})", mode="markers",
                    marker=dict(color=color, size=7, opacity=0.6))] if feasible else []
    front = sorted((data.trial(n) for n in data.front), key=lambda t: t.metric(1, "tok_s_per_user"))
    if front:
        traces.append(trace(front, "Pareto front", mode="lines", line=dict(color=color)))
    if data.chosen is not None:
        traces.append(trace([data.trial(data.chosen)], "chosen", mode="markers",
                            marker=dict(color=color, symbol="star", size=18,
                                        line=dict(color="black", width=1.5))))
    return traces


def concurrency_overlay(a: StudyData, b: StudyData) -> Panel:
    fig = go.Figure()
    for data, color in zip((a, b), STUDY_COLORS, strict=True):
        for spec, dash, label in ((True, "solid", "best speculative"), (False, "dot", "best AR")):
            curve = best_of(data.curves, spec=spec)
            if curve:
                fig.add_trace(go.Scatter(x=list(curve), y=list(curve.values()),
                                         name=f"{esc(data.name)}: {label}", mode="lines+markers",
                                         line=dict(color=color, dash=dash)))
    if not fig.data:
        return Panel(note="neither study has a successful trial")
    fig.update_xaxes(type="log", title_text="concurrency")
    fig.update_yaxes(title_text="output tok/s")
    return Panel(layout(fig))


_PARETO = ("Both studies' SLA-feasible configurations, each in its own colour: right is faster "
           "for one user, up is more throughput per GPU at that study's target concurrency. The "
           "line is each study's Pareto front, the star what <code>dflash-tune best</code> emits "
           "for it. <code>dflash-tune compare</code> prints the two choices side by side.")
_CONCURRENCY = ("Per study, the best output tok/s any speculative configuration (solid) and any "
                "plain one (dotted) reached at each concurrency: where the gap between the two "
                "studies opens, and where speculation stops paying on each.")
