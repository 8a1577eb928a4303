"""Inside one launch: the highest concurrency that still meets the SLA, and its throughput.

Comparing configurations at one fixed concurrency favours whichever happens to fit that level;
each configuration has its own limit (a DDTree server hits the TPOT limit at a lower
concurrency than plain decoding, with more tokens per request). The search brackets the limit
by doubling or halving from a guess, then interpolates the binding metric between the last
level that met the SLA and the first that did not, and measures there. Concurrency 1 is always
measured: it is the per-user objective.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field

from backends.contract import Measurement
from tuner.sla import Limit
from tuner.sla import meets

Measure = Callable[[int], Measurement]


@dataclass(slots=True)
class LimitSearch:
    """The levels measured (in order) and the best one that met the SLA (None: not even c=1)."""

    points: list[Measurement] = field(default_factory=list)
    best: Measurement | None = None


class _Failed(Exception):
    """A level failed (the server died, a request errored): stop measuring this launch."""


def search_limit(measure: Measure, limits: Sequence[Limit], max_concurrency: int,
                 guess: int | None = None, refinements: int = 2) -> LimitSearch:
    found = LimitSearch()

    def at(c: int) -> Measurement:
        m = measure(c)
        found.points.append(m)
        if not m.ok:
            raise _Failed
        if meets(m, limits) and (found.best is None or m.output_tok_s > found.best.output_tok_s):
            found.best = m
        return m

    try:
        first = at(1)
        if not meets(first, limits) or max_concurrency == 1:
            return found
        good, bad = _bracket(at, limits, max_concurrency, guess or 2, first)
        for _ in range(refinements):
            if bad is None or bad.concurrency - good.concurrency <= max(1, good.concurrency // 16):
                break
            m = at(_interpolate(good, bad, limits))
            good, bad = (m, bad) if meets(m, limits) else (good, m)
    except _Failed:
        found.best = None  # a launch that failed under load has no trustworthy limit
    return found


def _bracket(at: Measure, limits: Sequence[Limit], top: int, guess: int,
             first: Measurement) -> tuple[Measurement, Measurement | None]:
    """(highest level measured meeting the SLA, lowest level measured missing it or None)."""
    m = at(min(max(guess, 2), top))
    if meets(m, limits):
        while m.concurrency < top:
            good, m = m, at(min(2 * m.concurrency, top))
            if not meets(m, limits):
                return good, m
        return m, None
    bad = m  # the guess was too high: halve until a level fits (c=1 is known to)
    while bad.concurrency // 2 > 1:
        m = at(bad.concurrency // 2)
        if meets(m, limits):
            return m, bad
        bad = m
    return first, bad


def _interpolate(good: Measurement, bad: Measurement, limits: Sequence[Limit]) -> int:
    """Where the most binding limit's metric crosses its bound, linear in concurrency."""
    lo, hi = good.concurrency, bad.concurrency
    crossings = []
    for limit in limits:
        g, b = getattr(good, limit.metric), getattr(bad, limit.metric)
        if g is None or b is None or limit.violation(b) <= 0 or g == b:
            continue
        crossings.append(lo + (limit.value - g) / (b - g) * (hi - lo))
    c = round(min(crossings)) if crossings else (lo + hi) // 2
    return min(max(c, lo + 1), hi - 1)
