"""Cross-engine conformance: our engine against another (vLLM) on the same pair and prompts.

Greedy outputs of two correct engines agree until their arithmetic differs where the target's
top two logits are nearly tied: vLLM runs the pair in bf16, ours in fp32 here, so a divergence
is explained when our top-1 and the other engine's token are that close in our own logits.
Acceptance is compared per draft position: the share of verify rounds that accepted the draft
at position k, from our engine's per-round counts and from vLLM's per-position counters.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import httpx

from backends.flags import LaunchTarget, render_command, render_env
from backends.launch_params import LaunchParams
from backends.server import ServerSpec, free_port, launched
from backends.spec_metrics import Scrape, scrape, vllm_per_position


@dataclass(slots=True, frozen=True)
class Divergence:
    prompt: int  # index in the prompt list
    at: int  # first output position where the tokens differ
    ours: int
    theirs: int
    margin: float  # our logit of our token minus our logit of theirs (>= 0: ours is greedy)
    top2_margin: float  # our top-1 minus top-2 logit at that position


def completion_ids(base_url: str, model: str, prompts: Sequence[list[int]], max_tokens: int,
                   timeout_s: float = 300.0) -> list[list[int]]:
    """Greedy output token ids, one request at a time (no batching differences), from an
    OpenAI-compatible server that returns them (vLLM's `return_token_ids`)."""
    outputs = []
    with httpx.Client(base_url=base_url, timeout=timeout_s, trust_env=False) as client:
        for prompt in prompts:
            reply = client.post("/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True})
            reply.raise_for_status()
            outputs.append(list(reply.json()["choices"][0]["token_ids"]))
    return outputs


@dataclass(slots=True, frozen=True)
class GreedyServer:
    """A running vLLM to ask for greedy outputs, each batch with its own acceptance counts."""

    base_url: str
    model: str

    def run(self, prompts: Sequence[list[int]], max_tokens: int
            ) -> tuple[list[list[int]], list[float] | None]:
        """Greedy outputs for ``prompts`` and the per-position acceptance over exactly those
        requests (None without speculation)."""
        before = asyncio.run(_scrape(self.base_url))
        outputs = completion_ids(self.base_url, self.model, prompts, max_tokens)
        return outputs, vllm_per_position(before, asyncio.run(_scrape(self.base_url)))


@contextmanager
def vllm_server(target: LaunchTarget, launch: LaunchParams) -> Iterator[GreedyServer]:
    """vLLM launched for ``launch`` at ``target`` (on a free port), stopped on the way out."""
    target = replace(target, port=free_port(target.host))
    spec = ServerSpec(render_command("vllm", launch, target), target.port, target.host,
                      render_env("vllm", launch, None, target), start_timeout_s=900,
                      stop_timeout_s=30)
    with launched(spec) as server:
        yield GreedyServer(server.base_url, target.model_path)


async def _scrape(base_url: str) -> Scrape:
    async with httpx.AsyncClient(base_url=base_url, trust_env=False) as client:
        return await scrape(client, "vllm")


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (a length counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergences(target, prompts: Sequence[list[int]], ours: Sequence[list[int]],
                theirs: Sequence[list[int]]) -> list[Divergence]:
    """Every prompt whose outputs differ, with our logits' margins where they first do."""
    found = []
    for index, (prompt, a, b) in enumerate(zip(prompts, ours, theirs)):
        at = first_divergence(a, b)
        if at is None or at >= min(len(a), len(b)):
            continue
        logits = next_token_logits(target, prompt + a[:at])
        top2 = logits.topk(2).values
        found.append(Divergence(index, at, a[at], b[at], float(logits[a[at]] - logits[b[at]]),
                                float(top2[0] - top2[1])))
    return found


def next_token_logits(target, ids: list[int]):
    """The target's fp32 logits for the token after ``ids`` (one causal prefill)."""
    return _logits(target, ids)[-1]  # [vocab]


def _logits(target, ids: list[int]):
    """Logits of one causal forward over ``ids``, no cache: [len(ids), vocab]."""
    import torch

    from dflash_core.models.step import Step

    device = target.lm_head.weight.device
    with torch.inference_mode():
        step = Step.causal(torch.zeros(1, dtype=torch.long, device=device), len(ids), 0)
        return target.logits(target(torch.tensor([ids], device=device), step)[0][0])


def per_position_from_rounds(acceptance: Counter, drafts_per_round: int) -> list[float]:
    """Share of rounds whose draft at position k (0-based) was accepted, from our engine's
    per-round counts (tau = accepted + bonus -> rounds)."""
    rounds = sum(acceptance.values())
    if not rounds:
        return [0.0] * drafts_per_round
    return [sum(n for tau, n in acceptance.items() if tau - 1 > k) / rounds
            for k in range(drafts_per_round)]


def top2_margins(target, prompt: list[int], output: list[int]) -> list[float]:
    """Our top-1 minus top-2 logit at every output position of one greedy continuation."""
    top2 = _logits(target, prompt + output)[len(prompt) - 1:-1].topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()
