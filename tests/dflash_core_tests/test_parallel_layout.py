"""Which slice each rank holds (no ranks started: the layout is arithmetic), and the
architectures it cannot split."""

from __future__ import annotations

import pytest
import torch
from core_helpers import target_config

from dflash_core import CheckpointError
from dflash_core.models.random_checkpoint import write_random_pair
from dflash_core.parallel.layout import Layout, Span
from dflash_core.parallel.ranks import EngineRecipe, Ranks
from dflash_core.parallel.shard import load_sharded_target


def test_query_heads_split_and_kv_heads_replicate_past_their_count():
    cfg = target_config()  # 4 query heads, 2 KV heads
    tp2, tp4 = Layout(2), Layout(4)
    assert [tp2.q_heads(cfg, r) for r in range(2)] == [Span(0, 2), Span(2, 2)]
    assert [tp2.kv_heads(cfg, r) for r in range(2)] == [Span(0, 1), Span(1, 1)]
    # Four ranks, two KV heads: each rank keeps the one its query head reads.
    assert [tp4.kv_heads(cfg, r).start for r in range(4)] == [0, 0, 1, 1]


def test_experts_split_over_ep_groups_and_their_intermediate_over_the_rest():
    cfg = target_config(moe=True, num_experts=4, moe_intermediate_size=16)
    layout = Layout(tp=4, ep=2)  # two groups of two ranks
    assert [layout.experts(cfg, r) for r in range(4)] == [Span(0, 2)] * 2 + [Span(2, 2)] * 2
    assert [layout.expert_intermediate(cfg, r) for r in range(4)] == [Span(0, 8), Span(8, 8)] * 2
    assert Layout(2, 2).expert_intermediate(cfg, 1) == Span(0, 16)  # pure EP: whole experts


@pytest.mark.parametrize("layout, overrides, field", [
    (Layout(3), {}, "num_attention_heads"),
    (Layout(2), {"vocab_size": 47}, "vocab_size"),
    (Layout(4), {"num_key_value_heads": 4, "num_attention_heads": 12, "num_experts": 0,
                 "intermediate_size": 64, "vocab_size": 48}, None),
])
def test_layouts_that_do_not_split_evenly_are_refused(layout, overrides, field):
    cfg = target_config(**overrides)
    if field is None:
        layout.check(cfg)
        return
    with pytest.raises(CheckpointError, match=field):
        layout.check(cfg)


def test_ep_must_divide_tp():
    with pytest.raises(ValueError, match="ep dividing tp"):
        Layout(tp=2, ep=4)


def test_a_deepseek_target_is_refused_for_tp_before_any_rank_starts(tmp_path):
    target, drafter = write_random_pair("deepseek-v3", tmp_path, seed=0)
    with pytest.raises(CheckpointError, match="supports Qwen3 targets only"):
        Ranks(EngineRecipe(target, drafter, Layout(2), engine=dict(
            max_batch=1, max_context=16, max_tree_nodes=1), threads=1))
    assert not torch.distributed.is_initialized()  # refused before the process group
    with pytest.raises(CheckpointError, match="DeepSeek-V3 / Kimi K2"):
        load_sharded_target(target, Layout(2), comm=None)
