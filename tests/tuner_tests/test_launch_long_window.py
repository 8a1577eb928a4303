"""A launch's long window at its limit: when it misses the SLA the short windows passed, the
launch steps down and measures again, instead of being worth its concurrency-1 throughput."""

from __future__ import annotations

from backends.contract import Measurement
from backends.session import Session
from tuner.launches.launcher import Launcher
from tuner.sla import Limit

TPOT_LIMIT = Limit("tpot_p50_ms", "<=", 100.0)


class _Node(Session):
    """TPOT grows linearly with concurrency (100 ms at 100), throughput with it; long windows
    read 1% slower, as a longer window at the edge of the SLA may."""

    def __init__(self) -> None:
        super().__init__()
        self.windows: list[tuple[int, int | None]] = []

    def _level(self, concurrency: int, requests: int | None) -> Measurement:
        self.windows.append((concurrency, requests))
        tpot = (50.0 + concurrency / 2) * (1.01 if requests else 1.0)
        return Measurement(concurrency=concurrency, output_tok_s=concurrency * 1000.0 / tpot,
                           tpot_p50_ms=tpot, tok_s_per_user=1000.0 / tpot)


def _launcher() -> Launcher:
    launcher = object.__new__(Launcher)  # only the measuring half: no study, no records
    launcher.limits, launcher.max_concurrency, launcher.long_factor = [TPOT_LIMIT], 256, 4.0
    return launcher


def test_a_long_window_missing_the_sla_steps_down_instead_of_falling_back_to_concurrency_1():
    node = _Node()
    result = _launcher()._measure(node, {}, None, guess=100, bar=None, gates=None)
    long_windows = [c for c, requests in node.windows if requests]
    assert long_windows[0] == 100 and len(long_windows) == 2  # missed by 1%, stepped down once
    assert result.best.concurrency == long_windows[-1] < 100
    assert result.best.output_tok_s > 900.0  # not the 20 tok/s of concurrency 1
