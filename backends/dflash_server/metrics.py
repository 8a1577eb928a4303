"""Prometheus text for /metrics. Names are the contract `backends/spec_metrics.py` reads:
run-local acceptance = delta(dflash_spec_emitted_tokens_total) / delta(dflash_spec_rounds_total)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from backends.dflash_server.loop import Counters

_COUNTERS = {
    "dflash_requests": ("requests received", "requests"),
    "dflash_generated_tokens": ("tokens streamed to clients", "generated_tokens"),
    "dflash_spec_rounds": ("request-rounds of speculation (one per request per round)",
                           "spec_rounds"),
    "dflash_spec_emitted_tokens": ("tokens the rounds produced (accepted drafts + bonus)",
                                   "spec_emitted_tokens"),
    "dflash_failed_requests": ("requests ended by an engine error (not refused with a 400)",
                               "failed_requests"),
}
_GAUGES = {
    "dflash_num_requests_running": ("requests in the engine's batch", "running"),
    "dflash_num_requests_waiting": ("requests waiting for a free row", "waiting"),
}


class _Collector:
    def __init__(self, counters: Counters) -> None:
        self.counters = counters

    def collect(self):
        for name, (doc, field) in _COUNTERS.items():
            yield CounterMetricFamily(name, doc, value=getattr(self.counters, field))
        for name, (doc, field) in _GAUGES.items():
            yield GaugeMetricFamily(name, doc, value=getattr(self.counters, field))


def render_metrics(counters: Counters) -> str:
    registry = CollectorRegistry()
    registry.register(_Collector(counters))
    return generate_latest(registry).decode()
