"""``write_report``: one self-contained HTML file from the study in the DB."""

from __future__ import annotations

from collections.abc import Callable

import os
from datetime import datetime
from pathlib import Path

from tuner import records
from tuner.dashboard import figures
from tuner.dashboard import figures_study
from tuner.dashboard.analysis import failure_counts
from tuner.dashboard.analysis import failure_examples
from tuner.dashboard.data import StudyData
from tuner.dashboard.data import load_study_data
from tuner.dashboard.importance import param_importance
from tuner.dashboard.nightly import NightlyHistory
from tuner.dashboard.nightly import load_nightly
from tuner.dashboard.page import Section
from tuner.dashboard.page import esc
from tuner.dashboard.page import page
from tuner.dashboard.page import table
from tuner.dashboard.workers import trial_workers
from tuner.dashboard.workers import workers_line
from tuner.errors import UsageError

EXCERPT_CHARS = 600  # the tail of a log is where the error is
NIGHTLY_ROWS = 20
PROSE = ("message",)  # nightly columns holding a sentence
CELL_CHARS = 240  # room for a nightly verdict message; fingerprints get cut


def write_report(storage_url: str, study_name: str, out_path: str | os.PathLike,
                 refresh_s: int | None = None) -> Path:
    """Write the report of ``study_name`` to ``out_path`` and return the path. The file is
    replaced atomically, so a browser or ``serve_report`` never reads half of it.
    Raises NoResultError when the DB or the study does not exist, UsageError when ``out_path``
    cannot be written (checked before the report is built)."""
    return write_html(out_path, lambda: build_report(storage_url, study_name, refresh_s))


def write_html(out_path: str | os.PathLike, build: Callable[[], str]) -> Path:
    """``build()``'s page written to ``out_path`` atomically; the path is checked first."""
    out = Path(out_path)
    tmp = _writable_tmp(out)
    try:
        tmp.write_text(build(), encoding="utf-8")
        tmp.replace(out)
    except OSError as err:
        raise _unwritable(out, err) from None
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _writable_tmp(out: Path) -> Path:
    """The temporary file beside ``out`` the report goes to, created now: a directory or an
    unwritable place fails in a second, not after the report was built."""
    if out.is_dir():
        raise UsageError(f"{out} is a directory; give the report a file name, e.g. "
                         f"{out / 'report.html'}")
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.touch()
    except OSError as err:
        raise _unwritable(out, err) from None
    return tmp


def _unwritable(out: Path, err: OSError) -> UsageError:
    where = f" ({err.filename})" if err.filename and str(err.filename) != str(out) else ""
    return UsageError(f"cannot write the report to {out}: {err.strerror or err}{where}")


def build_report(storage_url: str, study_name: str, refresh_s: int | None = None) -> str:
    data = load_study_data(storage_url, study_name)
    engine = records.open_results(storage_url)
    try:
        imp = param_importance(engine, storage_url, study_name)
        history = load_nightly(engine, study_name)
        workers = trial_workers(engine, storage_url, study_name)
    finally:
        engine.dispose()  # a served report is rebuilt for hours; no pooled connections pile up
    sections = [
        Section("pareto", "Pareto front", _PARETO.format(t=data.target, sla=_sla(data)),
                figures.pareto(data)),
        Section("concurrency", "Throughput vs concurrency", _CONCURRENCY,
                figures.concurrency(data)),
        Section("acceptance", "Acceptance length", _ACCEPTANCE, figures.acceptance(data)),
        Section("breakdown", "Where the step time goes", _BREAKDOWN.format(t=data.target),
                figures.breakdown(data)),
        Section("importance", "Parameter importance", _IMPORTANCE,
                figures_study.importance(imp)),
        Section("failures", "Failures by class", _FAILURES, figures_study.failures(data.trials),
                _failure_table(data)),
        Section("nightly", "Nightly history", _NIGHTLY, figures_study.nightly(history),
                _nightly_table(history)),
    ]
    return page(f"dflash-tune: {data.name}", header(data, workers), sections, refresh_s)


_PARETO = ("Each point is a successful configuration: right is faster for one user, up is more "
           "throughput per GPU at concurrency {t}. Coloured points meet the SLA ({sla}), grey "
           "crosses miss it. The dotted line is the Pareto front among SLA-feasible points; the "
           "star is the configuration <code>dflash-tune best</code> emits.")
_CONCURRENCY = ("Per configuration family, the best output tok/s any of its configurations "
                "reached at each concurrency. The lower panel divides the best speculative "
                "(DFlash or DDTree) by the best plain (AR) configuration: below 1, speculation "
                "no longer pays; the red dotted line marks where that starts.")
_ACCEPTANCE = ("Mean tokens committed per decode step of each speculative configuration. "
               "Larger blocks and tree budgets accept more per step but cost more verify work; "
               "where the curve flattens, a bigger block or budget buys little.")
_BREAKDOWN = ("Per-component milliseconds of one decode step at concurrency {t} for the chosen "
              "configuration and the next best ones. The black tick is the performance model's "
              "roofline for the same configuration (datasheet bandwidth, no launch or latency "
              "overheads); the label says how many times slower than it the step is.")
_IMPORTANCE = ("How much of the variation in each objective each parameter explains, over the "
               "successful trials (Optuna's PED-ANOVA evaluator). Tune the top ones; the bottom "
               "ones can stay at their defaults.")
_FAILURES = ("Trials by outcome. <code>rejected</code> samples broke the search space's "
             "constraints and never reached a backend; the other classes are what the backend "
             "reported (<code>oom</code>, <code>crash</code>, <code>timeout</code>, ...). The "
             "table shows the latest log excerpt of each class.")
_NIGHTLY = ("Re-measurements of the chosen configuration and the plain baseline by "
            "<code>dflash-tune nightly</code>, oldest first: the incumbent's median (error bars: "
            "its MAD over the repeats) beside the baseline and the reference it was judged by. "
            "Red markers are runs that found a regression, orange ones runs that could not "
            "measure. The table lists the newest runs first.")


def _sla(data: StudyData) -> str:
    return esc(", ".join(data.sla) or "none")


def header(data: StudyData, workers: dict[str, list[int]] | None = None) -> str:
    """The study's facts; ``workers`` (``trial_workers``) adds which worker measured what."""
    measured = [t for t in data.trials if t.measured]
    ok = [t for t in measured if t.ok]
    facts = [("study", data.name), ("storage", data.storage), ("backend", data.backend),
             ("model", data.model_path), ("target concurrency", data.target),
             ("SLA", ", ".join(data.sla) or "none"),
             ("trials", f"{len(data.trials)} ({len(measured)} measured, {len(ok)} succeeded, "
                        f"{sum(t.feasible for t in ok)} meet the SLA)"),
             *([("measured by", workers_line(workers))] if workers else []),
             ("generated", datetime.now().strftime("%Y-%m-%d %H:%M:%S"))]
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in facts)
    return f"<h1>{esc(data.name)}</h1><table>{rows}</table>{_chosen(data)}"


def _chosen(data: StudyData) -> str:
    if data.chosen is None:
        return f'<p class="note">nothing chosen yet: {esc(data.choice_note)}</p>'
    t = data.trial(data.chosen)
    per_user = t.metric(1, "tok_s_per_user") or 0.0
    runs = f" (median of {data.chosen_runs} launches)" if data.chosen_runs > 1 else ""
    return (f"<p><b>Chosen:</b> trial #{t.number}, {esc(t.label)}: {data.chosen_tok_s:,.0f} "
            f"output tok/s {data.chosen_where}{runs}, {per_user:.1f} tok/s per user at "
            f"concurrency 1.</p><pre>{esc(t.command)}</pre>")


def _failure_table(data: StudyData) -> str:
    latest = failure_examples(data.trials)
    if not latest:
        return ""
    counts = failure_counts(data.trials)
    rows = [(status, counts[status], f"#{t.number}", t.log_excerpt[-EXCERPT_CHARS:])
            for status, t in latest.items()]
    return table(("class", "trials", "latest", "log excerpt"), rows, pre=("log excerpt",))


def _nightly_table(history: NightlyHistory) -> str:
    if not history.rows:
        return ""
    rows = [[_short(r.get(c)) for c in history.columns] for r in history.rows[-NIGHTLY_ROWS:]]
    return f'<div class="wide">{table(history.columns, rows[::-1], prose=PROSE)}</div>'


def _short(value: object) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else "" if value is None else str(value)
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS - 1] + "…"
