"""What every benchmark in bench/ shares: the host line, a timer, repeats summarised as a median
and a spread, ratios of runs measured in turns, the common options and a plain table.

Spread is the range over the median, (max - min) / median: of 3-6 repeats a reader can check
the range against the runs, and a MAD of so few says little.

    python bench/harness.py     # prints this machine's host line (bench/gpu_checks.sh uses it)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


def host() -> dict:
    """The machine a result was measured on: node, CPU model and vector capability, cores,
    load, Python, torch (threads, GPU) when the benchmark has imported it, and the date."""
    facts = {"node": platform.node(), "cpu": _cpu_model(), "cores": os.cpu_count(),
             "load": round(os.getloadavg()[0], 1), "python": platform.python_version(),
             "date": time.strftime("%Y-%m-%d %H:%M %Z")}
    torch = sys.modules.get("torch")  # importing it here would cost seconds to torch-free runs
    if torch is not None:
        facts |= {"torch": torch.__version__, "threads": torch.get_num_threads(),
                  "capability": torch.backends.cpu.get_cpu_capability()}
        if torch.cuda.is_available():
            facts["gpu"] = torch.cuda.get_device_name()
    return facts


def host_line() -> str:
    """`host()` as the one line a benchmark prints under its table."""
    f = host()
    parts = [f"{f['node']}: {f['cpu']}" + (f" ({f['capability']})" if "capability" in f else ""),
             f"{f['cores']} cores", f"load {f['load']}", f"Python {f['python']}"]
    if "torch" in f:
        parts.append(f"torch {f['torch']}, {f['threads']} thread" + "s" * (f["threads"] != 1))
    if "gpu" in f:
        parts.append(f["gpu"])
    return ", ".join(parts + [f["date"]])


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return (names or [platform.processor() or platform.machine()])[0]


class Timer:
    """Wall seconds since it was made: `timer = Timer(); work(); timer.s`."""

    def __init__(self) -> None:
        self.began = time.perf_counter()

    @property
    def s(self) -> float:
        return time.perf_counter() - self.began


def on_cuda(device: str) -> bool:
    return device.startswith("cuda")


def sync(device: str) -> None:
    """Wait for the device's queued work (nothing to wait for on a CPU)."""
    if on_cuda(device):
        import torch  # only the GPU benchmarks need it

        torch.cuda.synchronize()


def samples(fn: Callable[[], object], repeats: int = 5, warmup: int = 1,
            sync: Callable[[], object] = lambda: None) -> list[float]:
    """Seconds of each of `repeats` calls of fn() after `warmup` untimed ones; `sync` (e.g.
    torch.cuda.synchronize) is called before each clock read, so queued device work counts."""
    for _ in range(warmup):
        fn()
    sync()
    out = []
    for _ in range(repeats):
        timer = Timer()
        fn()
        sync()
        out.append(timer.s)
    return out


@dataclass(slots=True, frozen=True)
class Stat:
    """Repeated measurements of one quantity: their median and spread (range / median)."""

    runs: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def spread(self) -> float:
        return (max(self.runs) - min(self.runs)) / self.median if self.median else 0.0

    def cell(self, fmt: str = ".0f") -> str:
        """`median (spread%)`, e.g. "412 (3%)"."""
        return f"{self.median:{fmt}} ({self.spread:.0%})"

    def range_cell(self, fmt: str = ".2f") -> str:
        """`median (min-max)`, e.g. "1.02 (0.97-1.05)", for ratios."""
        return f"{self.median:{fmt}} ({min(self.runs):{fmt}}-{max(self.runs):{fmt}})"


def stat(values: Sequence[float]) -> Stat:
    return Stat(tuple(values))


def turn_ratios(ours: Sequence[float], theirs: Sequence[float]) -> Stat:
    """Per-repeat ratios ours[i] / theirs[i] of two things measured in turns (each repeat's
    pair ran back to back): on a machine whose speed drifts only these ratios mean anything."""
    return stat([a / b for a, b in zip(ours, theirs, strict=True)])


def turn_order(names: Sequence, repeat: int) -> list:
    """One repeat's order: reversed every other repeat, rotated every two, so each follows each
    other in some repeat (a rotation alone keeps the cycle, and what one leaves running after
    its turn, like vLLM's busy second after a level, would always fall on the same next one)."""
    names = list(names)
    shift = repeat // 2 % len(names)
    rotated = names[shift:] + names[:shift]
    return rotated[::-1] if repeat % 2 else rotated


def turns(names: Sequence, repeats: int):
    """(repeat, name) for every turn of `repeats` repeats, in `turn_order`."""
    return ((r, name) for r in range(repeats) for name in turn_order(names, r))


def arguments(doc: str, repeats: int | None = None, seed: int | None = None
              ) -> argparse.ArgumentParser:
    """A parser described by the docstring's first line, with `--json PATH` and, when given a
    default, `--repeats N` and `--seed S`. A bench that parses its arguments here also exits
    cleanly on SIGTERM (`timeout`, a scheduler), so its temporary folders are removed."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    if repeats is not None:
        parser.add_argument("--repeats", type=int, default=repeats, help="runs of each measurement")
    if seed is not None:
        parser.add_argument("--seed", type=int, default=seed, help="random seed")
    return parser


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def save_json(path: Path | None, result: dict) -> None:
    """Write `result` and the host to `path` (nothing when no path was asked for)."""
    if path:
        path.write_text(json.dumps(result | {"host": host()}, indent=2, default=str) + "\n")


def table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A Markdown table with each column padded to its widest cell (so it reads as plain text
    too); None prints as "-"."""
    cells = [[str(h) for h in header]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


if __name__ == "__main__":
    import torch  # noqa: F401 - so the line has torch's version, threads and GPU

    print(host_line())
