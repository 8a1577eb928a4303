"""Performance views: Pareto front, throughput vs concurrency, acceptance, step-time breakdown.

Each builder returns a :class:`Panel`: a figure, or a note saying why there is nothing to draw.
Text that came from the DB goes through ``esc`` because plotly reads a subset of HTML in text.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tuner.crossover import FAMILIES
from tuner.dashboard.analysis import best_few
from tuner.dashboard.data import StudyData
from tuner.dashboard.data import TrialView
from tuner.dashboard.roofline import Roofline

COLORS = dict(zip(FAMILIES, ("#636efa", "#1f2a8a", "#ef553b", "#a3270f", "#00a67e", "#00614a"),
                  strict=True))
COMPONENTS = {"gemm": "dense GEMMs", "moe": "experts", "attention": "attention",
              "linear_attention": "linear attention",
              "comm": "communication", "small_kernels": "small kernels",
              "ep_dispatch": "expert-parallel overhead", "draft": "drafter",
              "spec_round": "speculation round", "host_exposed": "host (exposed)"}


@dataclass(slots=True)
class Panel:
    figure: go.Figure | None = None
    note: str = ""


def esc(value: Any) -> str:
    return html.escape(str(value))


def layout(fig: go.Figure, height: int = 460, **extra: Any) -> go.Figure:
    settings = dict(template="plotly_white", height=height, margin=dict(l=60, r=20, t=40, b=50),
                    legend=dict(orientation="h", y=-0.18), hoverlabel=dict(align="left"))
    fig.update_layout(**(settings | extra))
    return fig


def _hover(t: TrialView, lines: list[str]) -> str:
    return "<br>".join([f"<b>#{t.number}</b> {esc(t.label)}", *lines])


def pareto(data: StudyData) -> Panel:
    target = data.target

    def drawn(t: TrialView) -> bool:
        """Measured at both axes' levels (a launch-aware launch measures the levels its own
        SLA search chose, which need not include the target, even on the Pareto front)."""
        return (t.metric(target, "output_tok_s") is not None
                and t.metric(target, "output_tok_s_per_gpu") is not None
                and t.metric(1, "tok_s_per_user") is not None)

    points = [t for t in data.ok_trials if drawn(t)]
    if not points:
        return Panel(note=f"no successful trial measured both concurrency 1 and {target}")

    def trace(ts: list[TrialView], name: str, **style: Any) -> go.Scatter:
        return go.Scatter(
            x=[t.metric(1, "tok_s_per_user") for t in ts],
            y=[t.metric(target, "output_tok_s_per_gpu") for t in ts], name=name,
            text=[_hover(t, [f"{t.metric(target, 'output_tok_s'):,.0f} tok/s at c={target}",
                             f"{t.metric(1, 'tok_s_per_user'):.1f} tok/s per user at c=1"])
                  for t in ts], hoverinfo="text", **style)

    fig = go.Figure()
    fig.add_trace(trace([t for t in points if not t.feasible], "misses the SLA",
                        mode="markers", marker=dict(color="#bbbbbb", symbol="x", size=6)))
    for family in FAMILIES:
        ts = [t for t in points if t.feasible and t.family == family]
        if ts:
            fig.add_trace(trace(ts, f"meets SLA: {family}", mode="markers",
                                marker=dict(color=COLORS[family], size=8, opacity=0.8)))
    front = sorted((t for t in map(data.trial, data.front) if drawn(t)),
                   key=lambda t: t.metric(1, "tok_s_per_user"))
    if front:
        fig.add_trace(trace(front, "Pareto front", mode="lines",
                            line=dict(color="black", dash="dot")))
    if data.chosen is not None and drawn(data.trial(data.chosen)):
        fig.add_trace(trace([data.trial(data.chosen)], "chosen (what `best` emits)",
                            mode="markers", marker=dict(color="gold", symbol="star", size=20,
                                                        line=dict(color="black", width=1.5))))
    return Panel(layout(fig, xaxis_title="tok/s per user at concurrency 1",
                        yaxis_title=f"output tok/s per GPU at concurrency {target}"))


def concurrency(data: StudyData) -> Panel:
    curves, cross = data.curves, data.crossover
    if not curves:
        return Panel(note="no successful trial to draw")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.7, 0.3],
                        vertical_spacing=0.06)
    for family, curve in curves.items():
        fig.add_trace(go.Scatter(x=list(curve), y=list(curve.values()), name=family,
                                 mode="lines+markers", line=dict(color=COLORS[family])), 1, 1)
    if cross.levels:
        fig.add_trace(go.Scatter(x=cross.levels, y=cross.speedup, mode="lines+markers",
                                 name="best speculative / best AR", line=dict(color="black")),
                      2, 1)
        fig.add_hline(y=1.0, line=dict(color="grey", dash="dash"), row=2, col=1)
    if cross.levels and cross.margin:  # predicted speedups: parity within the model's error
        fig.add_hrect(y0=1 / (1 + cross.margin), y1=1 + cross.margin, fillcolor="grey",
                      opacity=0.15, line_width=0, row=2, col=1,
                      annotation_text=f"model error +-{cross.margin:.0%}",
                      annotation_position="top left")
    if cross.stops_at is not None:
        fig.add_vline(x=cross.stops_at, line=dict(color="crimson", dash="dot"))
    levels = sorted({c for curve in curves.values() for c in curve})
    fig.update_xaxes(type="log", tickvals=levels, ticktext=[str(c) for c in levels])
    fig.update_xaxes(title_text="concurrency", row=2, col=1)
    fig.update_yaxes(title_text="output tok/s", row=1, col=1)
    fig.update_yaxes(title_text="speedup", row=2, col=1)
    title, top = esc(cross.note), 40
    if cross.caveat:  # a second, smaller line
        title, top = f"{title}<br><sup>{esc(cross.caveat)}</sup>", 64
    return Panel(layout(fig, height=560, title=dict(text=title, font=dict(size=14)),
                        margin=dict(l=60, r=20, t=top, b=50)), cross.settle_line())


def acceptance(data: StudyData) -> Panel:
    spec = [t for t in data.ok_trials if t.family and not t.family.startswith("AR")
            and _accept(t) is not None]
    if not spec:
        return Panel(note="no successful DFlash or DDTree trial reported an acceptance length")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("vs block size (DFlash and DDTree)",
                                                        "vs tree budget (DDTree)"))
    for algorithm, color in (("DFlash", COLORS["DFlash · TP"]), ("DDTree", COLORS["DDTree · TP"])):
        ts = [t for t in spec if t.family.startswith(algorithm)]
        fig.add_trace(_accept_trace(ts, "speculative_dflash_block_size", algorithm, color), 1, 1)
    ddtree = [t for t in spec if t.family.startswith("DDTree")]
    fig.add_trace(_accept_trace(ddtree, "speculative_ddtree_budget", "DDTree budget",
                                COLORS["DDTree · EP"]), 1, 2)
    fig.update_xaxes(title_text="block size (tokens per verify, anchor included)", row=1, col=1)
    fig.update_xaxes(title_text="tree budget (non-root nodes)", type="log", row=1, col=2)
    fig.update_yaxes(title_text="accepted tokens per step", row=1, col=1)
    return Panel(layout(fig))


def _accept(t: TrialView) -> float | None:
    """Acceptance at concurrency 1, or at any level the trial reached (it barely depends on
    load; a real engine reports it per run)."""
    value = t.metric(1, "accept_len_mean")
    return value if value is not None else next(
        (m["accept_len_mean"] for m in t.levels.values() if m.get("accept_len_mean")), None)


def _accept_trace(ts: list[TrialView], param: str, name: str, color: str) -> go.Scatter:
    from backends.launch_params import LaunchParams

    default = getattr(LaunchParams(), param)  # a space may leave the knob at its default
    return go.Scatter(x=[t.params.get(param, default) for t in ts], y=[_accept(t) for t in ts],
                      name=name, mode="markers", marker=dict(color=color, opacity=0.6, size=7),
                      text=[_hover(t, [f"{_accept(t):.2f} accepted per step"]) for t in ts],
                      hoverinfo="text")


def breakdown(data: StudyData, n: int = 5) -> Panel:
    rows = [t for t in best_few(data, n) if t.levels.get(data.target, {}).get("breakdown_ms")]
    if not rows:
        return Panel(note=f"the {esc(data.backend or 'study')} backend recorded no per-component "
                          "breakdown for these configurations")
    names = [f"#{t.number} {esc(t.label)}" for t in rows][::-1]  # the best on top
    parts = [t.levels[data.target]["breakdown_ms"] for t in rows][::-1]
    sources = _sources([t.levels[data.target] for t in rows])
    keys = list(dict.fromkeys([*COMPONENTS, *(k for p in parts for k in p)]))
    fig = go.Figure()
    for key in keys:
        values = [p.get(key, 0.0) for p in parts]
        if any(values):
            name = COMPONENTS.get(key, key) + (f" ({sources[key]})" if key in sources else "")
            fig.add_trace(go.Bar(y=names, x=values, name=esc(name),
                                 orientation="h",
                                 hovertemplate="%{x:.2f} ms<extra>%{fullData.name}</extra>"))
    note = _add_roofline(fig, data, rows[::-1], names, [sum(p.values()) for p in parts])
    return Panel(layout(fig, height=160 + 70 * len(rows), barmode="stack",
                        legend=dict(orientation="h", y=-0.25, traceorder="normal"),
                        xaxis_title=f"ms per decode step at concurrency {data.target}",
                        yaxis=dict(automargin=True)), note)


def _sources(levels: list[dict]) -> dict[str, str]:
    """Where each component's time comes from (measured, roofline, fitted), where the backend
    said and every configuration shown agrees; "mixed" where they differ."""
    seen: dict[str, set[str]] = {}
    for level in levels:
        for key, source in (level.get("breakdown_source") or {}).items():
            seen.setdefault(key, set()).add(source)
    return {k: v.pop() if len(v) == 1 else "mixed" for k, v in seen.items()}


def _add_roofline(fig: go.Figure, data: StudyData, rows: list[TrialView], names: list[str],
                  steps: list[float]) -> str:
    if data.backend != "model":
        return "roofline headroom is drawn for studies run with the model backend"
    roof = Roofline(data.config)
    ideal = [roof.step_ms(t.launch, data.target) for t in rows]
    shown = [(n, r, s) for n, r, s in zip(names, ideal, steps, strict=True) if r]
    if not shown:
        return "the performance model could not place these configurations on its roofline"
    fig.add_trace(go.Scatter(
        y=[n for n, _, _ in shown], x=[r for _, r, _ in shown], name="roofline (ideal step)",
        mode="markers+text", marker=dict(symbol="line-ns-open", size=26, color="black",
                                         line=dict(width=3)),
        text=[f"{s / r:.1f}x" for _, r, s in shown], textposition="top center",
        hovertemplate="roofline %{x:.2f} ms; step is %{text} of it<extra></extra>"))
    return ""
