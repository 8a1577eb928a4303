"""The collectives dflash_core's ranks run in a round agree with the performance model's
communication terms (backends.perf_model.traffic, which step._target_comm_ms times) for the same
shapes and layout, for dense, MoE and MLA (DeepSeek / Kimi) targets: counts exactly, bytes within
10%. The model speaks of bf16; the CPU ranks run fp32, so the sizes are taken at 4 bytes an
element."""

from __future__ import annotations

import pytest
import torch

from backends.launch_params import LaunchParams
from backends.perf_model.catalog import load_model
from backends.perf_model.traffic import replicated_draft_collectives, target_collectives
from dflash_core import SamplingParams, Spec
from dflash_core.models.random_checkpoint import BLOCK, write_random_pair
from dflash_core.parallel.layout import Layout
from dflash_core.parallel.ranks import EngineRecipe, Ranks

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15], [3]]
FP32 = 4
KIMI_BLOCK = 8  # the Kimi-shaped random drafter's block


def _launches(block: int) -> list[tuple[Spec, dict]]:
    """(engine spec, the same launch in the tuner's names)."""
    return [(Spec.none(), dict()),
            (Spec.dflash(block), dict(speculative_algorithm="dflash")),
            (Spec.ddtree(block, 8, topk=4), dict(speculative_algorithm="ddtree",
                                                 speculative_ddtree_budget=8))]


def _model_terms(model, lp: LaunchParams, rows: int) -> dict[str, tuple[int, float]]:
    """kind -> (collectives, bytes) the model counts for one round of `rows` requests."""
    parts = [target_collectives(model, lp, rows * lp.verify_tokens, FP32)]
    if lp.speculative:
        parts.append(replicated_draft_collectives(model, lp, rows, FP32))
    terms: dict[str, tuple[int, float]] = {}
    for part in parts:
        for kind, c in part.items():
            count, nbytes = terms.get(kind, (0, 0.0))
            terms[kind] = (count + c.count, nbytes + c.total)
    return terms


@pytest.mark.slow
@pytest.mark.parametrize("arch, tp, ep, block", [
    ("qwen3", 2, 1, BLOCK), ("qwen3-moe", 2, 2, BLOCK), ("deepseek-v3", 2, 1, KIMI_BLOCK),
    ("deepseek-v3", 2, 2, KIMI_BLOCK)], ids=["dense-tp2", "moe-tp2-ep2", "mla-tp2", "mla-tp2-ep2"])
def test_round_collectives_match_the_performance_model(tmp_path, arch, tp, ep, block):
    target, drafter = write_random_pair(arch, tmp_path)
    model = load_model(str(target))
    ranks = Ranks(EngineRecipe(target, drafter, Layout(tp, ep), threads=1, engine=dict(
        max_batch=len(PROMPTS), max_context=64, max_tree_nodes=16)))
    try:
        for spec, knobs in _launches(block):
            lp = LaunchParams(tp_size=tp, ep_size=ep, speculative_dflash_block_size=block, **knobs)
            with torch.inference_mode():
                batch = ranks.engine.open_batch(spec)
                batch.admit(PROMPTS, [SamplingParams(max_tokens=8)] * len(PROMPTS))
                before = batch.stats.comm.copy()
                batch.step()
            spent = batch.stats.comm.since(before)
            for kind, (count, nbytes) in _model_terms(model, lp, len(PROMPTS)).items():
                assert spent.calls[kind] == count, (spec, kind)
                assert spent.bytes[kind] == pytest.approx(nbytes, rel=0.10), (spec, kind)
            assert spent.calls["broadcast"] == 1  # the round's inputs, rank 0 to the others
    finally:
        ranks.close()
