"""Speculative acceptance length from a server's own counters, local to one measured run.

A load run scrapes the server before and after a concurrency level; :func:`accept_len` turns
the two :class:`Scrape` objects into tau, the mean number of tokens committed per verify round
(bonus token included), or ``None`` when the server does not expose what the flavor needs.

Flavors:

* ``vllm``: counters ``vllm:spec_decode_num_accepted_tokens_total`` and
  ``vllm:spec_decode_num_drafts_total``; tau = 1 + d(accepted) / d(drafts), as ``vllm bench``
  computes its run-local ``spec_decode_acceptance_length``.
* ``dflash``: our server (``dflash-tune serve``). **This module defines the contract**: counter
  ``dflash_spec_emitted_tokens_total`` counts every token a verify round commits (accepted
  drafts plus the bonus token), ``dflash_spec_rounds_total`` counts one per request per verify
  round; tau = d(emitted) / d(rounds).
* ``sglang``: ``sglang:spec_accept_length`` is a gauge (the last logged decode interval, not a
  counter), so it is read after the level only and is *not strictly run-local*; without
  ``--enable-metrics`` the fallback is ``/server_info``
  ``internal_states[*].avg_spec_accept_length``, a server-wide running average since launch
  (even less run-local).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from backends.errors import UserError

VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
DFLASH_EMITTED = "dflash_spec_emitted_tokens_total"
DFLASH_ROUNDS = "dflash_spec_rounds_total"
SGLANG_ACCEPT_GAUGE = "sglang:spec_accept_length"
# Field of each `/server_info` internal state (SGLang 0.5.11+; `bench_serving` reads
# internal_states[0]); some older builds put it at the top level, which is accepted too.
SGLANG_SERVER_INFO_ACCEPT_KEY = "avg_spec_accept_length"
# `/get_server_info` is the pre-0.5.11 name, still answered but deprecated.
SGLANG_SERVER_INFO_PATHS = ("/server_info", "/get_server_info")

_log = logging.getLogger(__name__)
# What prometheus_client's parser raises on a malformed line (IndexError: e.g. a stray "{,=").
_UNREADABLE = (ValueError, IndexError)


@dataclass(slots=True, frozen=True)
class Sample:
    """One line of Prometheus text exposition."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass(slots=True)
class Scrape:
    """What a server said about itself at one moment: its metric samples and server info."""

    samples: list[Sample] = field(default_factory=list)
    server_info: dict[str, Any] | None = None


def parse_exposition(text: str) -> list[Sample]:
    """Parse Prometheus text format with ``prometheus_client``'s parser: comments and blank
    lines are skipped, label values are unescaped, a trailing timestamp or OpenMetrics exemplar
    is dropped. Sample names are as exposed, except that a counter whose ``# TYPE`` lacks
    ``_total`` gets it on its samples (the library's naming; :func:`counter_sum` matches either
    way). A line the parser cannot read is skipped, with a warning, rather than failing the
    whole scrape."""
    try:
        families = list(text_string_to_metric_families(text))
    except _UNREADABLE:  # the library stops at the first bad line and loses the rest
        families = list(text_string_to_metric_families(_readable_lines(text)))
    return [Sample(s.name, s.labels, float(s.value)) for f in families for s in f.samples]


def _readable_lines(text: str) -> str:
    """``text`` without the lines the library cannot parse; every error it raises is about one
    line, so the lines it reads alone it also reads together."""
    kept = []
    for line in text.splitlines():
        try:
            list(text_string_to_metric_families(line))
        except _UNREADABLE as error:
            _log.warning("/metrics: skipped a line that is not Prometheus text (%s): %r",
                         str(error) or type(error).__name__, line)
            continue
        kept.append(line)
    return "\n".join(kept)


def _base(name: str) -> str:
    return name.removesuffix("_total")


def counter_sum(samples: list[Sample], name: str) -> float | None:
    """Sum of a counter over all its label sets (``None`` when absent). ``name`` matches with
    or without the ``_total`` suffix, since exposition formats differ on adding it."""
    values = [s.value for s in samples if _base(s.name) == _base(name)]
    return math.fsum(values) if values else None


def gauge_mean(samples: list[Sample], name: str) -> float | None:
    """Mean of a gauge over its label sets (e.g. one per DP rank); ``None`` when absent."""
    values = [s.value for s in samples if s.name == name and math.isfinite(s.value)]
    return math.fsum(values) / len(values) if values else None


def _delta(before: Scrape, after: Scrape, name: str) -> float | None:
    first, last = counter_sum(before.samples, name), counter_sum(after.samples, name)
    if first is None or last is None or last < first:  # absent, or the server restarted
        return None
    return last - first


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def _vllm(before: Scrape, after: Scrape) -> float | None:
    rate = _ratio(_delta(before, after, VLLM_ACCEPTED), _delta(before, after, VLLM_DRAFTS))
    return None if rate is None else 1.0 + rate


def vllm_per_position(before: Scrape, after: Scrape) -> list[float] | None:
    """Run-local share of drafts accepted at each draft position (0-based), from vLLM's
    ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position=k}``; None when absent."""
    drafts = _delta(before, after, VLLM_DRAFTS)
    first, last = _by_position(before), _by_position(after)
    if not drafts or not last or set(first) - set(last):
        return None
    return [(last[k] - first.get(k, 0.0)) / drafts for k in sorted(last)]


def _by_position(scrape: Scrape) -> dict[int, float]:
    counts: dict[int, float] = {}
    for s in scrape.samples:
        if _base(s.name) == _base(VLLM_ACCEPTED_PER_POS) and s.labels.get("position", "").isdigit():
            k = int(s.labels["position"])
            counts[k] = counts.get(k, 0.0) + s.value  # summed over engines / DP ranks
    return counts


def _dflash(before: Scrape, after: Scrape) -> float | None:
    return _ratio(_delta(before, after, DFLASH_EMITTED), _delta(before, after, DFLASH_ROUNDS))


def _sglang(before: Scrape, after: Scrape) -> float | None:
    gauge = gauge_mean(after.samples, SGLANG_ACCEPT_GAUGE)
    # 0 is what the gauge reads before the first logged speculative decode interval.
    if gauge is not None and gauge > 0:
        return gauge
    return server_info_accept_len(after.server_info)


def server_info_accept_len(info: dict[str, Any] | None) -> float | None:
    """Mean ``avg_spec_accept_length`` over SGLang's ``internal_states`` (one per DP rank)."""
    if not isinstance(info, dict):
        return None
    states = info.get("internal_states") or [info]
    values = [s.get(SGLANG_SERVER_INFO_ACCEPT_KEY) for s in states if isinstance(s, dict)]
    values = [v for v in values if isinstance(v, (int, float)) and v > 0]
    return math.fsum(values) / len(values) if values else None


_ACCEPT: dict[str, Callable[[Scrape, Scrape], float | None]] = {
    "vllm": _vllm, "dflash": _dflash, "sglang": _sglang, "none": lambda before, after: None,
}
FLAVORS = tuple(_ACCEPT)


def accept_len(flavor: str, before: Scrape, after: Scrape) -> float | None:
    """Tau over the interval between two scrapes; ``None`` when the metrics are absent."""
    if flavor not in _ACCEPT:
        raise UserError(f"unknown metrics flavor {flavor!r}; use one of {', '.join(FLAVORS)}")
    return _ACCEPT[flavor](before, after)


async def scrape(client: httpx.AsyncClient, flavor: str) -> Scrape:
    """Read ``/metrics`` (and ``/server_info`` for SGLang) through ``client``, whose base URL
    is the server. Never raises: an unreachable or metric-less server gives an empty scrape."""
    if flavor == "none":
        return Scrape()
    result = Scrape(samples=parse_exposition(await _get_text(client, "/metrics") or ""))
    if flavor == "sglang":
        result.server_info = await _server_info(client)
    return result


async def _get_text(client: httpx.AsyncClient, path: str) -> str | None:
    try:
        response = await client.get(path)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


async def _server_info(client: httpx.AsyncClient) -> dict[str, Any] | None:
    for path in SGLANG_SERVER_INFO_PATHS:
        try:
            response = await client.get(path)
            if response.status_code == 200:
                return response.json()
        except (httpx.HTTPError, ValueError):  # ValueError: a body that is not JSON
            continue
    return None
