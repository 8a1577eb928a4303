"""Speedup by batch for bench/engine_bench.py: plain decoding vs DFlash over B requests at once,
with the oracle proposer's acceptance profile. Does the gain fall as the batch grows?

Each rate is timed over the rounds in which every request is still running, after a first
identical run that captured every round shape (CUDA graphs on a GPU, eager on a CPU). A request
that ends early would leave the others' rounds timing a smaller batch. With random weights in
bf16 a request can also leave the oracle's reference (a near-tie that a wider verify rounds the
other way; its tokens are still the target's greedy ones): from there the oracle proposes the
wrong continuation and that request accepts about one token a round. That lowers the measured
τ, so each row also gives its cost per round against plain decoding's at the same batch, which
acceptance does not touch, and the speedup at the τ the profile sets for a chain (1 plus, per
depth, the chance that every depth up to it ranks the true token first).
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch
from harness import on_cuda, sync

from dflash_core import (
    AcceptanceProfile,
    Engine,
    EngineConfig,
    OracleProposer,
    SamplingParams,
    Spec,
    Target,
)


@torch.inference_mode()
def by_batch(target: Target, context: int, tokens: int, block: int, top1: float, device: str,
             fused: bool, batches: list[int], rows: list[dict], measured=lambda: None) -> None:
    """Appends a plain and a DFlash row per batch size to `rows`, calling `measured()` after
    each (a run cut short keeps them)."""
    graphs = on_cuda(device)
    profile = AcceptanceProfile.constant(block - 1, top1, (1 - top1) / 2)
    chain_tau = 1 + sum(math.prod(profile.top1[:depth]) for depth in range(1, block))
    for batch in batches:
        prompts = [[int(t) for t in torch.randint(1, 500, (context,))] for _ in range(batch)]
        config = EngineConfig(max_batch=batch, max_context=context + tokens + block + 2,
                              max_tree_nodes=block + 1, fused_attention=fused)
        reference = Engine(target, None, config).generate(
            prompts, SamplingParams(max_tokens=tokens + block)).tokens
        oracle = OracleProposer([p + r for p, r in zip(prompts, reference, strict=True)],
                                target.config.vocab_size, block, profile)
        graphed = dataclasses.replace(config, cuda_graphs=graphs)
        plain = _full_rounds(Engine(target, None, graphed), prompts, Spec.none(), tokens,
                             device)
        dflash = _full_rounds(Engine(target, oracle, graphed), prompts, Spec.dflash(block),
                              tokens, device)
        mode = "graphs" if graphs else "eager"
        cost = dflash["ms_per_round"] / plain["ms_per_round"]
        rows.append({"batch": batch, "method": "plain", "mode": mode, **plain})
        measured()
        rows.append({"batch": batch, "method": f"dflash b{block}", "mode": mode, **dflash,
                     "speedup": round(dflash["tok_s"] / plain["tok_s"], 2),
                     "round_vs_plain": round(cost, 2),
                     "speedup_at_profile": round(chain_tau / cost, 2)})
        measured()


def _full_rounds(engine: Engine, prompts: list[list[int]], spec: Spec, tokens: int,
                 device: str) -> dict:
    """tok/s, τ and ms per round over the rounds before the first request ends, from the
    second of two identical runs (the first captures every shape the second meets)."""
    for _ in range(2):
        batch = engine.open_batch(spec, len(prompts))
        batch.admit(prompts, [SamplingParams(max_tokens=tokens)] * len(prompts))
        sync(device)
        began, emitted, rounds = time.perf_counter(), 0, 0
        while len(batch.live_rows()) == len(prompts):
            emitted += sum(len(e.tokens) for e in batch.step())
            rounds += 1
        sync(device)
        elapsed = time.perf_counter() - began
    return {"tok_s": round(emitted / elapsed, 1), "tau": round(emitted / rounds / len(prompts), 2),
            "ms_per_round": round(elapsed / rounds * 1e3, 3), "rounds": rounds}
