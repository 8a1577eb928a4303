"""Measure each planned configuration its number of times, storing every repeat as it lands."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from backends import Backend, FailureClass, LaunchParams, Measurement, Workload
from tuner.interrupt import InterruptGate
from tuner.nightly.plan import BASELINE_ROLE, Probe
from tuner.sla import Limit
from tuner.stats import median

# Called after every repeat: (probe, repeat index, rows, failure class or None).
SaveRepeat = Callable[[Probe, int, Sequence[Measurement], "str | None"], None]
MISSING_LEVELS = "missing_levels"


@dataclass(slots=True)
class ProbeResult:
    probe: Probe
    values: list[float] = field(default_factory=list)  # output tok/s at the target, per repeat
    per_user: list[float] = field(default_factory=list)  # tok/s per user at concurrency 1
    at_target: list[Measurement] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # "oom: <last log line>"

    def meets(self, limits: Sequence[Limit]) -> bool:
        """The SLA holds on the median of each limited metric across repeats."""
        def med(metric: str) -> float | None:
            seen = [v for m in self.at_target if (v := getattr(m, metric)) is not None]
            return median(seen) if seen else None

        return bool(self.values) and all(limit.violation(med(limit.metric)) <= 0
                                          for limit in limits)


def measure_all(backend: Backend, probes: Sequence[Probe], workload: Workload, target: int,
                gate: InterruptGate, save: SaveRepeat, min_ok: int) -> list[ProbeResult]:
    """Every probe, incumbent first. When fewer than ``min_ok`` incumbent repeats succeed the
    neighbours are skipped (nothing to compare them with, and on a broken engine each would
    fail slowly); the baseline still runs, to tell a broken configuration from a broken engine."""
    first = measure_probe(backend, probes[0], workload, target, gate, save)
    rest = probes[1:] if len(first.values) >= min_ok else [
        p for p in probes[1:] if p.role == BASELINE_ROLE]
    return [first, *(measure_probe(backend, p, workload, target, gate, save) for p in rest)]


def measure_probe(backend: Backend, probe: Probe, workload: Workload, target: int,
                  gate: InterruptGate, save: SaveRepeat) -> ProbeResult:
    result = ProbeResult(probe)
    for repeat in range(probe.repeats):
        with gate.measuring():  # Ctrl-C stops a launch, never a DB write
            rows = _measure_once(backend, probe.launch, workload)
        failure = _failure(rows, target)
        save(probe, repeat, rows, failure and failure[0])
        _add(result, rows, target, failure and _describe(*failure))
    return result


def nightly_workload(workload: Workload, target: int) -> Workload:
    """Only the two levels the verdict reads: a shorter sweep on a real server."""
    levels = tuple(sorted({1, target}))
    return replace(workload, concurrency=levels)


def _measure_once(backend: Backend, launch: LaunchParams,
                  workload: Workload) -> list[Measurement]:
    try:
        return backend.measure(launch, workload)
    # The contract says a backend never raises; if one does, one bad repeat must not end the night.
    except Exception as err:  # noqa: BLE001
        return [Measurement.failed(c, FailureClass.CRASH, f"{type(err).__name__}: {err}")
                for c in workload.concurrency]


def _failure(rows: Sequence[Measurement], target: int) -> tuple[str, str] | None:
    """(failure class, last log line) of a failed repeat; None when it measured."""
    failed = next((m for m in rows if m.failure), None)
    if failed:
        last = failed.log_excerpt.strip().splitlines()[-1:] or [""]
        return failed.failure.value, last[0][:200]
    levels = {m.concurrency for m in rows}
    if not {1, target} <= levels:
        return MISSING_LEVELS, f"the backend returned levels {sorted(levels)}"
    return None


def _describe(failure: str, why: str) -> str:
    return f"{failure}: {why}" if why else failure


def _add(result: ProbeResult, rows: Sequence[Measurement], target: int,
         failure: str | None) -> None:
    if failure:
        result.failures.append(failure)
        return
    by_level = {m.concurrency: m for m in rows}
    result.values.append(by_level[target].output_tok_s)
    result.per_user.append(by_level[1].tok_s_per_user)
    result.at_target.append(by_level[target])
