"""The CLI's one output sink: machine output on stdout, everything human on stderr (Rich)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn
from rich.progress import MofNCompleteColumn
from rich.progress import Progress
from rich.progress import TextColumn
from rich.progress import TimeElapsedColumn
from rich.table import Table
from rich.text import Text

human = Console(stderr=True, highlight=False)
# A human-readable answer that is the command's whole output (estimate's table): stdout, so
# that `> file` keeps it; a command's machine format never shares stdout with it.
answer = Console(highlight=False)


def emit(text: str) -> None:
    """Machine-readable output: stdout, nothing else ever goes there."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def note(text: str, style: str = "", console: Console = human) -> None:
    console.print(Text(text, style=style), soft_wrap=True)


def error(text: str) -> None:
    human.print(f"[bold red]error:[/] {escape(text)}", soft_wrap=True)


@contextmanager
def trial_progress(total: int, already: int, what: str = "trials") -> Iterator[Any]:
    columns = (TextColumn(f"[bold]{what}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("best {task.fields[best]}"), TimeElapsedColumn())
    with Progress(*columns, console=human, transient=False) as bar:
        task = bar.add_task("trials", total=total, completed=already, best="-")

        def update(best_tok_s: float | None) -> None:
            best = f"{best_tok_s:,.0f} tok/s" if best_tok_s is not None else "-"
            bar.update(task, advance=1, best=best)

        yield update


@contextmanager
def launch_progress(total: int) -> Iterator[Any]:
    """A study's launches from every worker: done of ``total``, running, left, best so far."""
    columns = (TextColumn("[bold]launches"), BarColumn(), MofNCompleteColumn(),
               TextColumn("running {task.fields[running]}, left {task.fields[left]}"),
               TextColumn("best {task.fields[best]}"), TimeElapsedColumn())
    with Progress(*columns, console=human, transient=False) as bar:
        task = bar.add_task("launches", total=total, running=0, left=total, best="-")

        def update(done: int, running: int, best_tok_s: float | None) -> None:
            best = f"{best_tok_s:,.0f} tok/s" if best_tok_s is not None else "-"
            bar.update(task, completed=done, running=running,
                       left=max(0, total - done - running), best=best)

        yield update


@contextmanager
def stage_progress() -> Iterator[Any]:
    """One bar per named stage; the callback takes (stage, step, total, loss or None). Off a
    terminal (a log, a pipe, CI) a bar would show nothing until the end, so each stage prints
    plain lines instead: its first and last step and one every PLAIN_EVERY_S seconds."""
    if not human.is_terminal:
        yield _plain_stages()
        return
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn())
    with Progress(*columns, console=human, transient=False) as bar:
        tasks: dict[str, Any] = {}

        def update(stage: str, step: int, total: int, loss: float | None) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total, loss="-")
            bar.update(tasks[stage], completed=step, loss="-" if loss is None else f"{loss:.3f}")

        yield update


PLAIN_EVERY_S = 10.0


def _plain_stages() -> Any:
    began, printed = time.monotonic(), {}  # stage -> when its last line was printed

    def update(stage: str, step: int, total: int, loss: float | None) -> None:
        now = time.monotonic()
        if stage in printed and step < total and now - printed[stage] < PLAIN_EVERY_S:
            return
        printed[stage] = now
        loss_text = "" if loss is None else f" loss {loss:.3f}"
        note(f"{stage} {step}/{total}{loss_text} {now - began:.0f}s")

    return update


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
          compact: bool = False, console: Console = human) -> None:
    """``compact``: light rules, cells never wrapped, numbers right-aligned (a table of short
    cells that fits 80 columns)."""
    t = Table(title=Text(title), title_justify="left",
              box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD, pad_edge=not compact)
    for i, col in enumerate(columns):
        numeric = compact and all(isinstance(row[i], int | float) for row in rows)
        t.add_column(col, overflow="fold", no_wrap=compact,
                     justify="right" if numeric else "left")
    for row in rows:
        t.add_row(*(_cell(v) for v in row))
    console.print(t)


def _cell(value: Any) -> Text:
    """Cells are plain text: user strings (study names, paths) are never read as markup."""
    if isinstance(value, float):
        return Text(f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}")
    return Text("" if value is None else str(value))
