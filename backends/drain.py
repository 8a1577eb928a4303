"""The drain check between levels: a level starts only on an idle server.

Requests a previous level left behind (a client timed out, the server kept decoding) would share
the batch with the next level and inflate its latencies. Every engine exposes how many requests
it holds; we poll that until it is zero.
"""

from __future__ import annotations

import time

import httpx

from backends.spec_metrics import gauge_mean
from backends.spec_metrics import parse_exposition

# Requests running plus queued, per metrics flavor (names as each engine exports them).
BUSY_GAUGES = {
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    "dflash": ("dflash_num_requests_running", "dflash_num_requests_waiting"),
}


def busy_requests(client: httpx.Client, flavor: str) -> float | None:
    """Requests the server holds now; None when it does not say (no metrics, unknown flavor)."""
    names = BUSY_GAUGES.get(flavor)
    if not names:
        return None
    try:
        response = client.get("/metrics")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    samples = parse_exposition(response.text)
    values = [gauge_mean(samples, name) for name in names]
    known = [v for v in values if v is not None]
    # With one gauge per DP rank this is a mean; it is zero only when every rank is idle.
    return sum(known) if known else None


def wait_drained(base_url: str, flavor: str, timeout_s: float = 30.0,
                 period_s: float = 0.1) -> float:
    """Poll until the server holds no request; returns how many it still holds at the timeout
    (0.0 when drained or when the server does not export the numbers)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=base_url, timeout=5.0, trust_env=False) as client:
        while True:
            busy = busy_requests(client, flavor)
            if not busy or time.monotonic() >= deadline:
                return busy or 0.0
            time.sleep(period_s)
