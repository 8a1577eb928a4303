"""The SLA's TTFT bounds, the constraint values a sampler ranks infeasible trials by, and what
counts as an extreme metric of a winner."""

from __future__ import annotations

import pytest

from tuner.config import WorkloadConfig
from tuner.sla import Limit
from tuner.sla import extreme
from tuner.sla import with_bounds


def test_ttft_bounds_join_the_sla_unless_it_names_the_metric():
    w = WorkloadConfig()
    assert [str(x) for x in w.limits] == ["tpot_p50_ms<=100", "ttft_p50_ms<=5000",
                                          "ttft_p99_ms<=15000"]
    own = WorkloadConfig(sla=["ttft_p50_ms<=800"], ttft_p99_ms=None)
    assert [str(x) for x in own.limits] == ["ttft_p50_ms<=800"]
    tpot = Limit.parse("tpot_p50_ms<=30")  # what `best --sla` does with the stored bounds
    assert with_bounds([tpot], own.bounds) == [tpot, Limit("ttft_p50_ms", "<=", 5000.0)]


def test_every_measured_trial_ranks_before_every_failed_one_for_the_sampler():
    limits = [Limit.parse(s) for s in ("tpot_p50_ms<=100", "ttft_p50_ms<=5000",
                                       "ttft_p99_ms<=15000")]
    failed = 1.0 + sum(limit.constraint(None) for limit in limits)  # + the failure key
    queueing = sum(max(0.0, limit.constraint(v)) for limit, v in zip(limits, (104, 2e5, 3e5)))
    assert 0 < queueing < failed
    assert Limit.parse("tpot_p50_ms<=100").constraint(50) == pytest.approx(-0.5)
    assert Limit.parse("tok_s_per_user>=20").constraint(10) == pytest.approx(1 / 3)


def test_an_unbounded_ttft_past_the_whole_decode_is_extreme():
    row = {"ttft_p50_ms": 102_270.0, "ttft_p99_ms": 102_270.0, "tpot_p50_ms": 28.5}
    [why] = extreme(row, [Limit.parse("tpot_p50_ms<=30")], output_len=512)
    assert why.startswith("ttft_p50_ms is 102,270 ms (decoding 512 tokens takes 14,592 ms)")
    assert extreme(row, [Limit.parse("ttft_p50_ms<=200000"), Limit.parse("ttft_p99_ms<=2e5")],
                   512) == []
    assert extreme({**row, "ttft_p50_ms": 900.0, "ttft_p99_ms": 950.0}, [], 16) == []
