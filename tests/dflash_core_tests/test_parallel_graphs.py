"""CUDA graphs capture a TP2 round with its NCCL collectives (two GPUs, one per rank: NCCL
refuses two ranks on one device) and replay it to the single-device tokens."""

from __future__ import annotations

import pytest
import torch
from parallel_helpers import GREEDY, PROMPTS, SHIPPED, plain_tokens, specs

from dflash_core import build_engine, load_models
from dflash_core.parallel.layout import Layout
from dflash_core.parallel.ranks import EngineRecipe, Ranks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="TP2 over NCCL needs two GPUs, one per rank")]


def test_tp2_rounds_replay_as_cuda_graphs_with_their_collectives():
    engine = dict(max_batch=4, max_context=64, max_tree_nodes=20, batch_buckets=(4,))
    target, drafter = load_models(SHIPPED / "target", SHIPPED / "drafter", device="cuda")
    reference = plain_tokens(build_engine(target, drafter, **{**engine, "batch_buckets": ()}))
    ranks = Ranks(EngineRecipe(SHIPPED / "target", SHIPPED / "drafter", Layout(2),
                               device="cuda", engine=engine))
    try:
        assert ranks.engine.config.cuda_graphs
        for spec in specs(8):
            with torch.inference_mode():
                run = ranks.engine.generate(PROMPTS, GREEDY, spec)
                again = ranks.engine.generate(PROMPTS, GREEDY, spec)  # replays only
            assert run.tokens == again.tokens == reference, spec
            assert again.stats.comm.calls["all_reduce"] > 0  # counted on replay too
        graphs = [r.graphs for r in ranks.engine._rounds.values()]
        assert sum(g.replays for g in graphs) > 0
    finally:
        ranks.close()
