"""One self-contained HTML page: inline CSS, plotly.js inlined once, one script per figure.

Every string from the DB is escaped here or in ``figures``; figure JSON is made safe for a
``<script>`` element, so a ``</script>`` in a study name or log excerpt stays text.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from tuner.dashboard.figures import Panel

# JSON inside <script>: these characters must not be able to close the element or open a
# comment; \\u escapes keep the JSON value identical.
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                              "\u2028": "\\u2028", "\u2029": "\\u2029"})
_PLOT_CONFIG = '{"responsive": true, "displaylogo": false}'

_CSS = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1320px; padding: 16px 24px;
       color: #222; }
h1 { font-size: 1.5em; margin-bottom: 4px; }
h2 { margin-top: 36px; border-bottom: 1px solid #ddd; }
nav { margin: 14px 0; } nav a { margin-right: 14px; } .caption { color: #444; max-width: 900px; }
.note { background: #f6f6f6; border-left: 4px solid #999; padding: 8px 12px; }
table { border-collapse: collapse; font-size: 0.85em; margin: 8px 0; }
.wide { overflow-x: auto; } td.prose { min-width: 22em; }
td, th { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
pre { background: #f6f6f6; padding: 8px; white-space: pre-wrap; word-break: break-all;
      max-height: 16em; overflow: auto; margin: 0; }
"""


@dataclass(slots=True)
class Section:
    anchor: str
    title: str
    caption: str  # what to read from the view; trusted text written in this package
    panel: Panel
    extra_html: str = ""  # already escaped (tables built with ``table``)


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]], pre: Sequence[str] = (),
          prose: Sequence[str] = ()) -> str:
    """An HTML table of escaped cells; columns named in ``pre`` keep their line breaks, those
    in ``prose`` get room for a sentence."""
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join(_row(columns, row, pre, prose) for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _row(columns: Sequence[str], row: Sequence[Any], pre: Sequence[str],
         prose: Sequence[str]) -> str:
    cells = "".join(_cell(v, c in pre, c in prose) for c, v in zip(columns, row, strict=True))
    return f"<tr>{cells}</tr>"


def _cell(value: Any, pre: bool, prose: bool) -> str:
    if pre and value:
        return f"<td><pre>{esc(value)}</pre></td>"
    return f'<td class="prose">{esc(value)}</td>' if prose else f"<td>{esc(value)}</td>"


def figure_html(div_id: str, fig: go.Figure) -> str:
    payload = fig.to_json(validate=False).translate(_SCRIPT_SAFE)
    return (f'<div id="{div_id}" class="plot"></div>\n<script>(function () {{ var f = {payload};'
            f' Plotly.newPlot("{div_id}", f.data, f.layout, {_PLOT_CONFIG}); }})();</script>')


def section_html(s: Section) -> str:
    parts = [f'<section id="{s.anchor}"><h2>{esc(s.title)}</h2>',
             f'<p class="caption">{s.caption}</p>']
    if s.panel.figure is not None:
        parts.append(figure_html(f"fig-{s.anchor}", s.panel.figure))
    if s.panel.note:
        parts.append(f'<p class="note">{esc(s.panel.note)}</p>')
    parts.append(s.extra_html)
    parts.append("</section>")
    return "\n".join(parts)


def page(title: str, header_html: str, sections: Sequence[Section], refresh_s: int | None) -> str:
    from plotly.offline import get_plotlyjs

    refresh = f'<meta http-equiv="refresh" content="{int(refresh_s)}">' if refresh_s else ""
    nav = "".join(f'<a href="#{s.anchor}">{esc(s.title)}</a>' for s in sections)
    body = "\n".join(section_html(s) for s in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{refresh}'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{_CSS}</style>"
            f"<script>{get_plotlyjs()}</script></head>\n<body>{header_html}"
            f"<nav>{nav}</nav>\n{body}\n</body></html>\n")
