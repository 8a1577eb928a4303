"""From step times to the numbers a load test would report, at one concurrency level."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from backends.contract import Measurement
from backends.contract import Workload
from backends.launch_params import LaunchParams
from backends.perf_model import constants as C
from backends.perf_model.acceptance import Acceptance
from backends.perf_model.catalog import DrafterArch
from backends.perf_model.catalog import ModelArch
from backends.perf_model.memory import MemoryPlan
from backends.perf_model.step import Node
from backends.perf_model.step import draft_forward
from backends.perf_model.step import graphed
from backends.perf_model.step import target_forward
from backends.perf_model.terms import Term, fitted, total


@dataclass(slots=True, frozen=True)
class Setup:
    """Everything fixed for one configuration; only the concurrency varies."""

    node: Node
    engine: str  # the serving engine (its scheduler decides how prefills are batched)
    model: ModelArch
    drafter: DrafterArch | None
    lp: LaunchParams
    plan: MemoryPlan
    acceptance: Acceptance | None  # None without speculation
    # The acceptance of other speculation knobs: a round-capped tree's at each batch.
    acceptance_of: Callable[[LaunchParams], Acceptance | None]
    # The engine prepares each round on the host while the GPU runs the previous one
    # (flags.rounds_overlapped): the round's own work overlaps the device like its launches.
    rounds_overlapped: bool
    # The most tokens a prefill forward holds and still replays as CUDA graphs (0: every
    # prefill runs eagerly; flags.graphed_prefill_tokens).
    graphed_prefill_tokens: float = 0.0

    def at_batch(self, batch: int) -> Setup:
        """The setup a step over `batch` running requests runs: a round-capped DDTree's
        smaller tree and its acceptance (LaunchParams.at_batch); otherwise this one."""
        lp = self.lp.at_batch(batch)
        if lp is self.lp:
            return self
        return replace(self, lp=lp, acceptance=self.acceptance_of(lp))


def step_terms(s: Setup, batch: int, context: float) -> dict[str, Term]:
    """Each component of one decode step for ``batch`` running requests on one replica: its
    time (ms), where the time comes from and its speed of light (terms.Term)."""
    padded = graphed(s.lp, batch)
    use_graph = padded is not None
    verify = target_forward(s.node, s.model, s.lp, batch, s.lp.verify_tokens, context,
                            use_graph, padded)
    # Terms only some layouts have (EP, a hybrid's linear attention) are left out when empty.
    parts = {k: t for k, t in verify.terms.items()
             if t.ms or k not in ("ep_dispatch", "linear_attention")}
    host = verify.host
    if s.acceptance is not None and s.drafter is not None:
        # SGLang runs the drafter eagerly under attention-DP even with decode graphs on.
        draft_graph = use_graph and not s.lp.enable_dp_attention
        draft = draft_forward(s.node, s.model, s.drafter, s.lp, batch, s.acceptance.mean,
                              context, draft_graph, padded if draft_graph else None)
        parts["draft"] = total(draft.terms.values())
        host += draft.host
    device = sum(t.ms for t in parts.values())
    if s.acceptance is not None:
        parts["spec_round"] = fitted(_round_work(s, batch, host, device))
    parts["host_exposed"] = fitted(_exposed_host(s, host, device))
    return parts


def _round_work(s: Setup, batch: int, host: float, device: float) -> float:
    """What a speculative round's own work (ms) adds to its step: the accept walk, KV commit /
    rollback, the drafter's launch sequence, the scheduler between the round's syncs. No
    kernel table sees it; published DFlash rounds at concurrency 1 are far slower than their
    kernels alone. Serial (the host waits for the GPU's result, then works while the GPU
    idles), it adds whole; where the engine prepares the next round while the GPU runs this
    one, it is host time beside the launches and shows as they do. Either way a host-bound
    (eager) round pays it whole: the host cannot hide its own work behind its launches."""
    eff = s.node.eff
    work = (eff.spec_round_us + batch * eff.spec_request_us) / 1e3
    if not s.rounds_overlapped:
        return work
    return _exposed_host(s, host + work, device) - _exposed_host(s, host, device)


def _exposed_host(s: Setup, host: float, device: float) -> float:
    """The share of a forward's host time (ms) that adds to its device time. Launches are
    asynchronous: the host runs ahead of the GPU until the one sync, so only host time beyond
    the device time shows, and never less than EXPOSED_HOST_FLOOR of it. A CPU host runs the
    kernels it dispatches, so all of its dispatch time adds to theirs."""
    if not s.node.hw.host_overlaps_device:
        return host
    return max(C.EXPOSED_HOST_FLOOR * host, host - device)


def step_breakdown(s: Setup, batch: int, context: float) -> dict[str, float]:
    """Per-component ms of one decode step for ``batch`` running requests on one replica."""
    return {name: t.ms for name, t in step_terms(s, batch, context).items()}


def predict(s: Setup, workload: Workload, concurrency: int) -> Measurement:
    """Steady state of ``concurrency`` closed-loop clients: each request is one prefill and
    ``output_len / accepted`` decode rounds, and every finished request is replaced by a new
    one whose prefill the running batch waits for: throughput = running x output / (rounds x
    step + running x prefill), a prefill priced as the engine packs it (``prompts_packed``)."""
    dp = s.lp.dp_size
    running = min(concurrency, s.plan.max_requests * dp)
    batch = math.ceil(running / dp)
    s = s.at_batch(batch)
    context = workload.input_len + workload.output_len / 2
    terms = step_terms(s, batch, context)
    parts = {name: t.ms for name, t in terms.items()}
    step_ms = sum(parts.values())
    accepted = s.acceptance.mean if s.acceptance else 1.0
    rounds = workload.output_len / accepted
    prefill = _prefill(s, workload.input_len, prompts_packed(s.engine, batch, rounds))
    prefill_ms = prefill.ms
    # One replica's time to finish its ``batch`` requests, its own prefills included.
    cycle_ms = rounds * step_ms + batch * prefill_ms
    output_tok_s = running * workload.output_len / cycle_ms * 1e3
    parts["prefill_share"] = batch * prefill_ms / rounds  # per round, as the step sees it
    sources = {name: t.source for name, t in terms.items()}
    sources["prefill_share"] = prefill.source
    sol = {name: t.sol_pct for name, t in terms.items() if t.sol_pct is not None}
    # A request's decode is stalled by the other running requests' prefills.
    tpot_ms = (rounds * step_ms + (batch - 1) * prefill_ms) / workload.output_len
    ttft_ms = _prefill(s, workload.input_len, 1).ms + step_ms
    if concurrency > running:  # the rest wait for a slot: one request's whole life per slot
        ttft_ms += (concurrency - running) / running * cycle_ms
    return Measurement(
        concurrency=concurrency, output_tok_s=output_tok_s,
        output_tok_s_per_gpu=output_tok_s / s.lp.gpus,
        tok_s_per_user=output_tok_s / concurrency,
        ttft_p50_ms=ttft_ms, ttft_p99_ms=ttft_ms, tpot_p50_ms=tpot_ms, tpot_p99_ms=tpot_ms,
        accept_len_mean=accepted,
        accept_len_hist=list(s.acceptance.hist) if s.acceptance else None,
        peak_mem_gib=s.plan.peak_gib, breakdown_ms=parts, breakdown_source=sources,
        breakdown_sol_pct=sol, predicted=True,
    )


def prefill_free_tok_s(m: Measurement) -> float:
    """The output rate of a second in which no prompt is prefilled: a level's cycle is its
    rounds times (step + prefill_share), so without the prefills the same batch outputs
    ``step + prefill_share`` over ``step`` times as fast."""
    step_ms = sum(m.breakdown_ms.values())
    decode_ms = step_ms - m.breakdown_ms.get("prefill_share", 0.0)
    return m.output_tok_s * step_ms / decode_ms if decode_ms > 0 else 0.0


def prompts_packed(engine: str, batch: int, rounds: float) -> int:
    """Prompts one prefill forward packs in the steady state of ``batch`` running requests of
    ``rounds`` decode rounds each. An engine that puts new prompts into the decode step's own
    batch (PREFILL_IN_DECODE_BATCH) spreads them over the steps it already runs: priced as a
    chunk of many prompts, each pays its own tokens' work, not a weight read. An engine that
    runs the waiting prompts as a batch of their own between two decode steps packs only what
    arrived since the last one: ``batch / rounds`` prompts a round (requests finish apart, their
    lengths staggered), and a prefill runs as soon as one waits, so it packs the mean of a
    Poisson count given at least one: a lone prompt at low arrival rates, whose forward reads
    every weight the way a whole chunk does."""
    if engine in C.PREFILL_IN_DECODE_BATCH:
        return batch
    arrivals = batch / max(rounds, 1.0)
    return max(1, round(arrivals / -math.expm1(-arrivals)))


def _prefill(s: Setup, input_len: int, packed: int) -> Term:
    """Time one prompt costs the engine when a prefill forward packs ``packed`` of them (up to
    the engine's prefill chunk; 64 at most): each prompt pays its share of the chunk's weight
    reads, and its GEMMs and attention to the prompt so far (half of it, on average). The host
    time overlaps the GPU's. Run eagerly, it is the forward's launches and, per MoE layer, the
    work beyond them (``prefill_moe_host_us``). Replayed as CUDA graphs broken at each layer's
    attention (``graphed_prefill_tokens``), it is a segment's replay and the attention's own
    launches a layer. The drafter's own prefill is left out (a small share: a few layers)."""
    chunk = min(C.CHUNKED_PREFILL_TOKENS, max(input_len, min(packed, 64) * input_len))
    prompts = max(1, chunk // input_len)  # prompts the chunk holds
    rows = min(chunk, prompts * input_len)
    fwd = target_forward(s.node, s.model, s.lp, prompts, rows // prompts, input_len / 2,
                         use_graph=False, prefill=True)
    host = fwd.host
    if rows <= s.graphed_prefill_tokens:
        host = s.node.host_ms(C.GRAPH_REPLAY_LAUNCHES
                              + s.model.num_layers * C.PREFILL_GRAPH_BREAK_LAUNCHES)
    elif s.engine not in C.COMPILED_FORWARD:
        host += s.node.eff.prefill_moe_host_us / 1e3 * s.model.num_moe_layers
    per_chunk = fwd.device + _exposed_host(s, host, fwd.device)
    ms = per_chunk / prompts * max(1.0, input_len / C.CHUNKED_PREFILL_TOKENS)
    return Term(ms, total(fwd.terms.values()).source)
