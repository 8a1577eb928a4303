"""The load generator against a real stub server process, and the Prometheus-side arithmetic.

The stub (fake_servers/openai_stub.py) stamps its own perf_counter times per request, counts
requests in flight and exposes dflash_spec_* counters, so each number the load generator
reports can be checked against what the server actually did.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client import Counter
from prometheus_client import Histogram
from prometheus_client import generate_latest

from backends.contract import FailureClass
from backends.drain import busy_requests
from backends.latency import LevelResult
from backends.latency import RequestResult
from backends.loadgen import LoadSpec
from backends.loadgen import arrival_gaps
from backends.loadgen import run_levels
from backends.loadgen import run_load
from backends.spec_metrics import VLLM_ACCEPTED
from backends.spec_metrics import Scrape
from backends.spec_metrics import accept_len
from backends.spec_metrics import counter_sum
from backends.spec_metrics import gauge_mean
from backends.spec_metrics import parse_exposition
from backends.spec_metrics import vllm_per_position

STUB = Path(__file__).parent / "fake_servers" / "openai_stub.py"
FAST = {"ttft_ms": 2.0, "tokens_per_s": 2000.0}
# Stub timings for the 5% comparisons, per concurrency. On a 2-vCPU test machine a burst of 32
# requests costs the Python client (httpx + h11) and the stub's intake ~20-30 ms before the
# server stamps arrival, so at 32 the server's TTFT has to be long for that to stay under 5%.
# At 1, 250 ms leaves 12 ms for a loaded machine's event-loop jitter.
TIMED = {1: {"ttft_ms": 250.0, "tokens_per_s": 100.0},
         32: {"ttft_ms": 1000.0, "tokens_per_s": 50.0}}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"stub exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=0.5, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    pytest.fail(f"stub not healthy after 20 s: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def stub_url(request, tmp_path_factory):
    port, log = _free_port(), tmp_path_factory.mktemp("stub") / "stub.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, str(STUB), "--port", str(port), "--ttft-ms", "50",
             "--tokens-per-s", "200"],
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    request.addfinalizer(lambda: _stop(proc))
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, proc, log)
    return url


class Stub:
    def __init__(self, url: str):
        self.url = url
        self.http = httpx.Client(base_url=url, trust_env=False)

    def configure(self, **config) -> None:
        self.http.post("/debug/reset").raise_for_status()
        defaults = {"ttft_ms": 100.0, "tokens_per_s": 100.0, "accept_len": 3, "fail_every": 0, "usage": True}
        self.http.post("/debug/config", json={**defaults, **config}).raise_for_status()

    def state(self) -> dict:
        return self.http.get("/debug/requests").json()

    def spec(self, **fields) -> LoadSpec:
        defaults = {"base_url": self.url, "model": "stub-model", "prompts": ["hello"],
                    "output_len": 20, "concurrency_levels": (1,), "metrics_flavor": "dflash"}
        return LoadSpec(**{**defaults, **fields})


@pytest.fixture
def stub(stub_url):
    client = Stub(stub_url)
    client.configure()
    yield client
    client.http.close()


def _level(spec: LoadSpec) -> LevelResult:
    [level] = asyncio.run(run_levels(spec))
    return level


def _rel_err(measured: float, truth: float) -> float:
    return abs(measured - truth) / truth


# --- timing against the server's own stamps ------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 32])
def test_ttft_and_e2e_agree_with_server_stamps(stub, concurrency):
    stub.configure(**TIMED[concurrency])
    spec = stub.spec(output_len=8, concurrency_levels=(concurrency,), warmup_requests=1,
                     requests_per_level=max(6, 2 * concurrency))
    level = _level(spec)
    served = stub.state()["requests"][spec.warmup_requests:]
    assert level.failed == 0 and len(served) == len(level.requests)
    server_ttft = statistics.median(r["first_token_s"] - r["arrival_s"] for r in served)
    server_e2e = statistics.median(r["last_token_s"] - r["arrival_s"] for r in served)
    lat = level.latency_ms()
    assert _rel_err(lat["ttft_p50_ms"] / 1e3, server_ttft) < 0.05, (lat, server_ttft)
    assert _rel_err(lat["e2e_p50_ms"] / 1e3, server_e2e) < 0.05, (lat, server_e2e)
    assert lat["itl_p50_ms"] == pytest.approx(1e3 / TIMED[concurrency]["tokens_per_s"], rel=0.2)


def test_chat_role_chunk_is_not_a_token_and_chunks_count_without_usage(stub):
    stub.configure(usage=False)  # the client has to count text chunks itself
    spec = stub.spec(endpoint="/v1/chat/completions", requests_per_level=4, output_len=6,
                     warmup_requests=1)
    level = _level(spec)
    served = stub.state()["requests"][spec.warmup_requests:]
    server_ttft = statistics.median(r["first_token_s"] - r["arrival_s"] for r in served)
    assert [r.output_tokens for r in level.requests] == [6] * 4
    assert "usage" not in level.requests[0].server_meta
    # The role chunk goes out on arrival; counting it would make TTFT ~1 ms instead of ~100 ms.
    assert _rel_err(level.latency_ms()["ttft_p50_ms"] / 1e3, server_ttft) < 0.05


# --- accounting ----------------------------------------------------------------------------------


def test_every_request_is_counted_once_at_concurrency_256(stub):
    stub.configure(**FAST)
    spec = stub.spec(prompts=[[1, 2, 3], [4, 5]], output_len=8, concurrency_levels=(256,),
                     requests_per_level=384)  # a full wave and a half
    level = _level(spec)
    served = stub.state()["requests"][spec.warmup_requests:]
    assert len(level.requests) == 384 == len(served)
    assert len({id(r) for r in level.requests}) == 384
    assert level.failed == 0 and all(r["status"] == 200 for r in served)
    assert level.output_tokens == sum(r["tokens_sent"] for r in served) == 384 * 8


def test_closed_loop_keeps_exactly_concurrency_in_flight(stub):
    stub.configure(ttft_ms=10.0, tokens_per_s=500.0)
    level = _level(stub.spec(output_len=10, concurrency_levels=(16,), requests_per_level=64))
    assert stub.state()["max_in_flight"] == 16  # the server never saw more
    # Client side: each request after the first wave starts once another has ended, so at every
    # start exactly 16 are in flight (the finished one's end is stamped before the next start).
    starts = sorted(r.start_s for r in level.requests)
    in_flight = [sum(r.start_s <= t < r.end_s for r in level.requests) for t in starts]
    assert in_flight == list(range(1, 17)) + [16] * 48


# --- failures ------------------------------------------------------------------------------------


def test_failed_requests_are_counted_not_raised(stub):
    stub.configure(fail_every=3, **FAST)
    level = _level(stub.spec(concurrency_levels=(4,), requests_per_level=24, warmup_requests=0))
    assert len(level.requests) == 24 == len(stub.state()["requests"])
    assert level.failed == 8 and level.output_tokens == 16 * 20
    m = level.measurement()
    assert m.ok and "8 of 24 requests failed" in m.log_excerpt and "HTTP 500" in m.log_excerpt


def test_all_requests_failing_is_a_transient_failure(stub):
    stub.configure(fail_every=1, **FAST)
    [m] = run_load(stub.spec(concurrency_levels=(2,)))
    assert m.failure is FailureClass.TRANSIENT
    assert "8 of 8 requests failed" in m.log_excerpt and "stub failure" in m.log_excerpt


def test_unreachable_server_is_a_transient_failure():
    spec = LoadSpec(base_url=f"http://127.0.0.1:{_free_port()}", model="m", prompts=["x"],
                    output_len=4, concurrency_levels=(1, 4), metrics_flavor="vllm")
    rows = run_load(spec)
    assert [m.failure for m in rows] == [FailureClass.TRANSIENT] * 2
    assert "ConnectError" in rows[0].log_excerpt


def test_slow_request_times_out_as_an_error(stub):
    stub.configure(ttft_ms=2000.0)
    level = _level(stub.spec(requests_per_level=2, warmup_requests=0, timeout_s=0.2))
    assert [r.error for r in level.requests] == ["timed out after 0.2 s"] * 2
    assert level.measurement().failure is FailureClass.TRANSIENT


# --- run-local acceptance ------------------------------------------------------------------------


def test_acceptance_is_local_to_each_level(stub):
    stub.configure(**FAST)
    # Prompts are consumed in order: warm-up 2, level one 8, warm-up 2, level two 8. Warm-ups
    # accept 1 token a round, so any leak of them (or of the other level) shifts the result.
    prompts = ["accept=1"] * 2 + ["accept=2"] * 8 + ["accept=1"] * 2 + ["accept=4"] * 8
    spec = stub.spec(prompts=prompts, output_len=8, concurrency_levels=(1, 4),
                     requests_per_level=8)
    levels = asyncio.run(run_levels(spec))
    assert [level.accept_len for level in levels] == [pytest.approx(2.0), pytest.approx(4.0)]
    assert levels[1].measurement().accept_len_mean == pytest.approx(4.0)


def test_default_stub_acceptance_is_three(stub):
    stub.configure(**FAST)
    level = _level(stub.spec(output_len=9, requests_per_level=8))
    assert level.accept_len == pytest.approx(3.0)
    assert _level(stub.spec(output_len=9, metrics_flavor="none")).accept_len is None


# --- measurement arithmetic ----------------------------------------------------------------------


def _request(start: float, ttft: float, gaps: list[float]) -> RequestResult:
    times = [start + ttft + sum(gaps[:i]) for i in range(len(gaps) + 1)]
    return RequestResult(start_s=start, first_token_s=times[0], end_s=times[-1],
                         output_tokens=len(times), token_times=times)


def test_measurement_from_hand_timed_requests():
    requests = [_request(0.0, 0.1, [0.01] * 9), _request(0.0, 0.3, [0.02] * 9),
                RequestResult(start_s=0.0, end_s=0.05, error="HTTP 500: boom")]
    m = LevelResult(concurrency=2, requests=requests, wall_s=1.0, accept_len=2.5).measurement(4)
    assert m.ok and m.output_tok_s == pytest.approx(20.0)
    assert m.output_tok_s_per_gpu == pytest.approx(5.0)
    assert m.tok_s_per_user * m.concurrency == pytest.approx(m.output_tok_s)
    assert m.ttft_p50_ms == pytest.approx(200.0) and m.ttft_p99_ms == pytest.approx(298.0)
    assert m.tpot_p50_ms == pytest.approx(15.0)  # (E2E - TTFT) / (n - 1): 10 ms and 20 ms
    assert m.itl_p50_ms == pytest.approx(15.0) and m.itl_p99_ms == pytest.approx(20.0)
    assert m.accept_len_mean == 2.5
    assert "1 of 3 requests failed" in m.log_excerpt and "HTTP 500: boom" in m.log_excerpt


def test_chat_endpoint_rejects_token_id_prompts():
    with pytest.raises(ValueError, match="text prompts"):
        LoadSpec(base_url="http://x", model="m", prompts=[[1, 2]], output_len=4,
                 concurrency_levels=(1,), endpoint="/v1/chat/completions")


# --- Prometheus exposition and acceptance formulas -----------------------------------------------

EXPOSITION = r"""
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="kimi"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="kimi"} 50.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="kimi"} 1.7e+09

vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="kimi"} 210 1712345678000
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="kimi"} 90 # {trace="a}"} 1.0
weird{path="a,b}c",quote="say \"hi\"\n",slash="\\"} NaN
inf_metric +Inf
not a sample line
"""


def test_parser_reads_labels_and_skips_comments():
    samples = parse_exposition(EXPOSITION)
    assert [s.name for s in samples] == [
        "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_drafts_created", "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total", "weird", "inf_metric"]
    assert samples[0].labels == {"engine": "0", "model_name": "kimi"}
    assert samples[3].value == 210.0  # the trailing timestamp is not the value
    assert samples[4].value == 90.0  # an OpenMetrics exemplar is not the value either
    assert samples[5].labels == {"path": "a,b}c", "quote": 'say "hi"\n', "slash": "\\"}
    assert samples[6].value == float("inf")


def test_counter_sums_label_sets_with_or_without_total_suffix():
    samples = parse_exposition(EXPOSITION)
    assert counter_sum(samples, "vllm:spec_decode_num_drafts_total") == 150.0
    assert counter_sum(samples, "vllm:spec_decode_num_drafts") == 150.0  # _created not summed
    assert counter_sum(samples, "vllm:spec_decode_num_accepted_tokens") == 300.0
    assert counter_sum(samples, "vllm:spec_decode_num_draft_tokens") is None


# vLLM 0.3x's /metrics as prometheus_client writes it (trimmed): gauges, a histogram with its
# _bucket / _sum / _count and _created lines, counters with _total and _created, a model path
# whose label value holds escaped quotes and backslashes.
VLLM_METRICS = r"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/m/Qwen3 \"8B\" \\ fp8"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="/m/Qwen3 \"8B\" \\ fp8"} 2.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="q"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="q"} 5.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="q"} 7.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="q"} 7.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="q"} 0.6125
# HELP vllm:time_to_first_token_seconds_created Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds_created gauge
vllm:time_to_first_token_seconds_created{engine="0",model_name="q"} 1.7963e+09
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="q"} 40.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="q"} 1.7963e+09
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="q"} 100.0
"""

# SGLang's /metrics (--enable-metrics, two DP ranks): gauges per rank, the acceptance gauge, a
# histogram, and a counter declared without _total (the parser names its sample with _total).
SGLANG_METRICS = r"""# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",model_name="kimi",tp_rank="0"} 4.0
sglang:num_running_reqs{dp_rank="1",model_name="kimi",tp_rank="0"} 0.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",model_name="kimi",tp_rank="0"} 1.0
sglang:num_queue_reqs{dp_rank="1",model_name="kimi",tp_rank="0"} 1.0
# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{dp_rank="0",model_name="kimi",tp_rank="0"} 3.25
sglang:spec_accept_length{dp_rank="1",model_name="kimi",tp_rank="0"} 3.75
# HELP sglang:e2e_request_latency_seconds Histogram of End-to-end request latency in seconds
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{le="1.0",model_name="kimi"} 2.0
sglang:e2e_request_latency_seconds_bucket{le="+Inf",model_name="kimi"} 3.0
sglang:e2e_request_latency_seconds_sum{model_name="kimi"} 4.5
sglang:e2e_request_latency_seconds_count{model_name="kimi"} 3.0
# HELP sglang:prompt_tokens Number of prefill tokens processed.
# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens{model_name="kimi"} 9216
"""


def _values(samples, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for s in samples if s.name == name]


def test_parser_reads_a_vllm_metrics_page():
    samples = parse_exposition(VLLM_METRICS)
    running = _values(samples, "vllm:num_requests_running")
    assert running == [({"engine": "0", "model_name": '/m/Qwen3 "8B" \\ fp8'}, 3.0)]
    buckets = _values(samples, "vllm:time_to_first_token_seconds_bucket")
    assert [(labels["le"], value) for labels, value in buckets] == [
        ("0.04", 1.0), ("0.1", 5.0), ("+Inf", 7.0)]
    assert _values(samples, "vllm:time_to_first_token_seconds_count")[0][1] == 7.0
    assert _values(samples, "vllm:time_to_first_token_seconds_sum")[0][1] == 0.6125
    assert counter_sum(samples, "vllm:spec_decode_num_drafts") == 40.0  # _created not summed
    assert counter_sum(samples, VLLM_ACCEPTED) == 100.0
    assert gauge_mean(samples, "vllm:num_requests_waiting") == 2.0
    assert all(isinstance(s.value, float) for s in samples)


def test_parser_reads_an_sglang_metrics_page():
    samples = parse_exposition(SGLANG_METRICS)
    assert gauge_mean(samples, "sglang:num_running_reqs") == 2.0
    assert gauge_mean(samples, "sglang:spec_accept_length") == 3.5
    assert accept_len("sglang", Scrape(), Scrape(samples)) == pytest.approx(3.5)
    assert _values(samples, "sglang:e2e_request_latency_seconds_sum") == [
        ({"model_name": "kimi"}, 4.5)]
    assert _values(samples, "sglang:prompt_tokens_total") == [({"model_name": "kimi"}, 9216.0)]
    assert counter_sum(samples, "sglang:prompt_tokens") == 9216.0


def test_parser_reads_what_prometheus_client_writes():
    """Both engines export through prometheus_client: its own output must read back exactly."""
    registry = CollectorRegistry()
    model = 'C:\\models\\qwen "fast"\nv2'
    drafts = Counter("vllm:spec_decode_num_drafts", "drafts", ["model_name"], registry=registry)
    drafts.labels(model).inc(12)
    ttft = Histogram("vllm:time_to_first_token_seconds", "ttft", ["model_name"],
                     buckets=(0.1, 1.0), registry=registry)
    for seconds in (0.05, 0.5, 2.0):
        ttft.labels(model).observe(seconds)
    samples = parse_exposition(generate_latest(registry).decode())
    assert _values(samples, "vllm:spec_decode_num_drafts_total") == [({"model_name": model}, 12.0)]
    buckets = _values(samples, "vllm:time_to_first_token_seconds_bucket")
    assert [(labels["le"], value) for labels, value in buckets] == [
        ("0.1", 1.0), ("1.0", 2.0), ("+Inf", 3.0)]
    assert _values(samples, "vllm:time_to_first_token_seconds_sum")[0][1] == pytest.approx(2.55)
    assert _values(samples, "vllm:time_to_first_token_seconds_count")[0][1] == 3.0


def test_malformed_lines_are_skipped_with_a_warning_and_the_rest_is_kept(caplog):
    text = VLLM_METRICS.replace(
        "# TYPE vllm:num_requests_waiting gauge",
        '# TYPE vllm:num_requests_waiting gauge\nbroken{model_name="q" 1\n{,\t=#9-a')
    samples = parse_exposition(text)
    assert samples == parse_exposition(VLLM_METRICS)  # everything after the bad lines too
    skipped = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(skipped) == 2 and "broken{" in skipped[0] and "{,\\t=#9-a" in skipped[1]
    assert parse_exposition("") == [] and parse_exposition("# only a comment\n\n") == []


def _metrics_client(text: str) -> httpx.Client:
    return httpx.Client(base_url="http://server", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, text=text)))


def test_the_drain_check_reads_vllm_and_sglang_pages():
    with _metrics_client(VLLM_METRICS) as client:
        assert busy_requests(client, "vllm") == 5.0  # 3 running + 2 waiting
    with _metrics_client(SGLANG_METRICS) as client:
        assert busy_requests(client, "sglang") == 3.0  # per-rank means: 2 running + 1 queued
    with _metrics_client("not metrics at all\n") as client:
        assert busy_requests(client, "vllm") is None


def _scrape(text: str, server_info: dict | None = None) -> Scrape:
    return Scrape(parse_exposition(text), server_info)


def _vllm_text(drafts: tuple[int, int], accepted: tuple[int, int]) -> str:
    return "\n".join(
        f'vllm:spec_decode_num_drafts_total{{engine="{e}"}} {drafts[e]}\n'
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="{e}"}} {accepted[e]}'
        for e in (0, 1))


def test_vllm_acceptance_is_one_plus_accepted_per_draft_over_the_interval():
    before = _scrape(_vllm_text((100, 50), (300, 100)))
    after = _scrape(_vllm_text((160, 90), (480, 240)))  # +100 drafts, +320 accepted
    assert accept_len("vllm", before, after) == pytest.approx(4.2)


def test_counter_reset_or_missing_metrics_give_none():
    before = _scrape(_vllm_text((100, 50), (300, 100)))
    restarted = _scrape(_vllm_text((1, 1), (2, 2)))
    assert accept_len("vllm", before, restarted) is None
    assert accept_len("vllm", before, before) is None  # no drafts in between
    assert accept_len("dflash", Scrape(), Scrape()) is None
    assert accept_len("sglang", Scrape(), Scrape()) is None


def test_dflash_acceptance_is_emitted_per_round():
    text = "dflash_spec_emitted_tokens_total {}\ndflash_spec_rounds_total {}"
    assert accept_len("dflash", _scrape(text.format(10, 5)),
                      _scrape(text.format(40, 15))) == pytest.approx(3.0)


def test_sglang_acceptance_reads_the_gauge_after_the_level():
    after = _scrape("# TYPE sglang:spec_accept_length gauge\n"
                    'sglang:spec_accept_length{dp_rank="0"} 3.0\n'
                    'sglang:spec_accept_length{dp_rank="1"} 4.0\n')
    assert gauge_mean(after.samples, "sglang:spec_accept_length") == 3.5
    assert accept_len("sglang", Scrape(), after) == pytest.approx(3.5)


def test_sglang_acceptance_falls_back_to_server_info():
    info = {"internal_states": [{"avg_spec_accept_length": 2.0}, {"avg_spec_accept_length": 3.0}]}
    after = _scrape("sglang:spec_accept_length 0.0\n", info)  # 0: nothing logged yet
    assert accept_len("sglang", Scrape(), after) == pytest.approx(2.5)
    assert accept_len("sglang", Scrape(), _scrape("", {"avg_spec_accept_length": 3.2})) == 3.2


def test_unknown_flavor_is_rejected():
    with pytest.raises(ValueError, match="flavor"):
        accept_len("trtllm", Scrape(), Scrape())


# --- open loop and per-prompt lengths ----------------------------------------------------------


def test_each_prompt_asks_for_its_own_output_length_in_order(stub):
    stub.configure(**FAST)
    spec = stub.spec(prompts=["a", "b", "c"], output_lens=[3, 5, 7], warmup_requests=0,
                     concurrency_levels=(1,), requests_per_level=6)
    level = _level(spec)
    assert [r["tokens_sent"] for r in stub.state()["requests"]] == [3, 5, 7, 3, 5, 7]
    assert sorted(r.output_tokens for r in level.requests) == [3, 3, 5, 5, 7, 7]


def test_output_lengths_must_match_the_prompts():
    with pytest.raises(ValueError, match="output_lens"):
        LoadSpec("http://x", "m", ["a", "b"], 4, (1,), output_lens=[3])
    with pytest.raises(ValueError, match="request_rate"):
        LoadSpec("http://x", "m", ["a"], 4, (1,), request_rate=0.0)


def test_an_open_loop_sends_poisson_arrivals_capped_at_the_concurrency(stub):
    """Requests arrive at exponential gaps of mean 1 / rate, whatever the server does; the cap
    holds when arrivals outpace it, and the same seed gives the same arrival times."""
    stub.configure(ttft_ms=5.0, tokens_per_s=400.0)  # 8 tokens: ~25 ms a request
    spec = stub.spec(output_len=8, concurrency_levels=(64,), requests_per_level=80,
                     warmup_requests=0, request_rate=40.0, seed=3)
    level = _level(spec)
    starts = sorted(r.start_s for r in level.requests)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    # Mean gap 25 ms; with 79 gaps the sample mean is within ~35% of it at 3 sigma, and a
    # loaded machine's event loop only adds lag to each sleep.
    assert 0.016 < statistics.mean(gaps) < 0.045
    # Exponential, not fixed: gaps spread (coefficient of variation ~1; a ticker would give ~0).
    assert statistics.stdev(gaps) / statistics.mean(gaps) > 0.5
    # Far more arrivals than a closed loop of 1..64 users pacing themselves would make in flight
    # at once were never reached: at 40 req/s and 25 ms each, about 1 is in flight.
    assert stub.state()["max_in_flight"] < 16

    capped = stub.spec(output_len=40, concurrency_levels=(2,), requests_per_level=12,
                       warmup_requests=0, request_rate=1000.0, seed=3)
    stub.configure(ttft_ms=5.0, tokens_per_s=400.0)
    _level(capped)
    assert stub.state()["max_in_flight"] == 2  # arrivals 1 ms apart, each 100 ms long


def test_open_loop_arrival_times_repeat_with_the_seed():
    first, again, other = (arrival_gaps(50.0, 400, seed) for seed in ("1:8", "1:8", "2:8"))
    assert first == again and first != other and first[0] == 0.0
    # Exponential gaps of mean 1 / rate: mean and SD both ~20 ms (400 draws: within ~15%).
    assert 0.017 < statistics.mean(first[1:]) < 0.023
    assert 0.8 < statistics.stdev(first[1:]) / statistics.mean(first[1:]) < 1.2


def _vllm_scrape(drafts: float, per_position: list[float]) -> Scrape:
    """vLLM 0.32's exposition lines as its CPU build printed them for the tiny pair."""
    model = 'engine="0",model_name="/pair/target"'
    lines = [f"vllm:spec_decode_num_drafts_total{{{model}}} {drafts}",
             f"vllm:spec_decode_num_drafts_created{{{model}}} 1.796e+09"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{model},position="{k}"}} {v}'
              for k, v in enumerate(per_position)]
    return Scrape(parse_exposition("\n".join(lines)))


def test_vllm_acceptance_per_draft_position_is_run_local():
    before = _vllm_scrape(3.0, [2.0, 2.0, 1.0])
    after = _vllm_scrape(13.0, [10.0, 7.0, 3.0])
    assert vllm_per_position(before, after) == [0.8, 0.5, 0.2]
    assert vllm_per_position(Scrape(), Scrape()) is None  # a server without the counters
    assert vllm_per_position(after, after) is None  # no drafts in the run
