"""Which slice each rank holds (no ranks started: the layout is arithmetic), and the layouts
a Qwen3 or DeepSeek config cannot split, refused by the dimension's name."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from core_helpers import target_config

from dflash_core import CheckpointError
from dflash_core.models.random_checkpoint import write_random_pair
from dflash_core.models.random_checkpoint_deepseek import kimi_like_config
from dflash_core.parallel.layout import Layout, Span
from dflash_core.parallel.ranks import EngineRecipe, Ranks, check_devices
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


@pytest.mark.parametrize("layout, overrides, field", [
    (Layout(8), {}, "num_attention_heads"),  # 4 heads
    (Layout(4, 4), {"n_routed_experts": 6, "n_group": 1}, "num_experts"),
    (Layout(2), {"intermediate_size": 129}, "intermediate_size"),
    (Layout(2, 2), {"n_shared_experts": 3, "moe_intermediate_size": 33}, "shared experts"),
    (Layout(4), {}, "INT4 group_size 32"),  # 64 / 4 = 16 per rank: half a group
])
def test_deepseek_layouts_that_do_not_split_are_refused_by_name(layout, overrides, field):
    cfg = replace(kimi_like_config(), **overrides)
    with pytest.raises(CheckpointError, match=field):
        layout.check(cfg)


def test_deepseek_layouts_that_split_pass_the_check():
    for tp, ep in [(2, 1), (2, 2), (4, 2), (4, 4)]:
        Layout(tp, ep).check(kimi_like_config())
    Layout(4).check(replace(kimi_like_config(), quantization=None))  # float experts: no groups


def test_a_layout_that_cannot_split_is_refused_before_any_rank_starts(tmp_path):
    target, drafter = write_random_pair("deepseek-v3", tmp_path, seed=0)
    with pytest.raises(CheckpointError, match="group_size"):
        Ranks(EngineRecipe(target, drafter, Layout(4), engine=dict(
            max_batch=1, max_context=16, max_tree_nodes=1), threads=1))
    assert not torch.distributed.is_initialized()  # refused before the process group
    with pytest.raises(CheckpointError, match="group_size"):
        load_sharded_target(target, Layout(4), comm=None)


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has a GPU per rank")
def test_more_cuda_ranks_than_gpus_are_refused_before_any_rank_starts(tmp_path):
    target, drafter = write_random_pair("qwen3", tmp_path, seed=0)
    for device in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match="NCCL refuses two ranks on one GPU"):
            Ranks(EngineRecipe(target, drafter, Layout(2), device=device, engine=dict(
                max_batch=1, max_context=16, max_tree_nodes=1), threads=1))
        assert not torch.distributed.is_initialized()
    check_devices("cuda", 1)  # one rank: no NCCL
