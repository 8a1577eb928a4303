"""One verify forward over a tree equals plain causal forwards over each root-to-node path, and
committing the accepted path (from the nodes `NodeWrites` held) leaves the cache exactly as a
causal forward would."""

from __future__ import annotations

import pytest
import torch
from core_helpers import make_target

from dflash_core.models import attention
from dflash_core.models.attention import attend
from dflash_core.models.cache import NodeWrites
from dflash_core.models.step import Step
from dflash_core.speculation.accept import accept
from dflash_core.speculation.tree import Tree, build_tree, chain_tree

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1]]


def _prefill(target, cache, prompts):
    for b, prompt in enumerate(prompts):
        step = Step.causal(torch.zeros(1, dtype=torch.long), len(prompt), 0)
        target(torch.tensor([prompt]), step, cache.row(b))


def _causal_logits(target, tokens):
    cache = target.allocate_cache(1, len(tokens))
    hidden, _ = target(torch.tensor([tokens]), Step.causal(torch.zeros(1, dtype=torch.long),
                                                           len(tokens), 0), cache)
    return target.logits(hidden)[0], cache


def _random_tree(batch, budget, seed, depth=4, vocab=48):
    gen = torch.Generator().manual_seed(seed)
    logprobs = torch.randn(batch, depth, vocab, generator=gen).mul(3).log_softmax(-1)
    anchors = torch.randint(0, vocab - 1, (batch,), generator=gen)
    return build_tree(anchors, logprobs, budget, topk=3, max_depth=depth, spine=seed % 2 == 0)


def _verify(target, cache, prompts, tree):
    starts = torch.tensor([len(p) for p in prompts])
    step = Step(starts[:, None] + tree.depths, starts[:, None] + torch.arange(tree.num_nodes),
                starts, int(starts.max()), tree.mask)
    hidden, features = target(tree.tokens, step, cache)
    return target.logits(hidden), starts


def _path(tree: Tree, b: int, node: int) -> list[int]:
    nodes = []
    while node >= 0:
        nodes.append(node)
        node = int(tree.parents[b, node])
    return nodes[::-1]


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("budget", [3, 12])
def test_each_tree_node_sees_exactly_its_root_path(moe, budget):
    target = make_target(moe)
    cache = target.allocate_cache(2, 64)
    assert_nodes_see_their_root_paths(target, cache, PROMPTS, budget)


def assert_nodes_see_their_root_paths(target, cache, prompts, budget):
    """One verify of a random tree after prefilling ``prompts``: each node's logits equal a
    causal forward over its prompt and root path."""
    _prefill(target, cache, prompts)
    tree = _random_tree(len(prompts), budget, seed=budget)
    logits, _ = _verify(target, cache, prompts, tree)
    for b, prompt in enumerate(prompts):
        for node in range(tree.num_nodes):
            if tree.valid[b, node]:
                path_tokens = tree.tokens[b, _path(tree, b, node)].tolist()
                expected, _ = _causal_logits(target, prompt + path_tokens)
                torch.testing.assert_close(logits[b, node], expected[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("budget", [2, 12])  # below and above the depth of 4
def test_commit_leaves_the_cache_of_a_causal_forward_over_the_accepted_tokens(budget):
    target = make_target()
    cache = target.allocate_cache(2, 64)
    _prefill(target, cache, PROMPTS)
    tree = _random_tree(2, budget, seed=7)
    before = cache.k.clone(), cache.v.clone()
    nodes = NodeWrites(cache)
    _, starts = _verify(target, nodes, PROMPTS, tree)
    assert torch.equal(cache.k, before[0]) and torch.equal(cache.v, before[1])  # held, not written
    deepest = tree.depths.masked_fill(~tree.valid, -1).argmax(-1)  # accept the deepest node
    post = _post_following(tree, deepest)
    acc = accept(tree, post, path_len=5)
    assert acc.lengths.tolist() == (tree.depths.gather(1, deepest[:, None])[:, 0] + 1).tolist()
    nodes.commit(starts, acc.path, 5)
    assert_cache_holds_the_accepted_tokens(target, cache, PROMPTS, tree, acc)


def assert_cache_holds_the_accepted_tokens(target, cache, prompts, tree, acc,
                                           field_names=("k", "v")):
    """Each row's committed slots equal a causal forward's over its prompt + accepted tokens."""
    for b, prompt in enumerate(prompts):
        n = int(acc.lengths[b])
        assert n > 1  # a real path was written, not just the root
        accepted = tree.tokens[b, acc.path[b, :n]].tolist()
        _, expected = _causal_logits(target, prompt + accepted)
        length = len(prompt) + n
        for name in field_names:
            torch.testing.assert_close(getattr(cache, name)[:, b, :, :length],
                                       getattr(expected, name)[:, 0, :, :length],
                                       atol=1e-5, rtol=1e-5)


def test_a_chain_commit_writes_its_nodes_in_order():
    """path None (plain decoding, DFlash): nodes 0..A-1 at slots start + 0..A-1, as a direct
    write of the verify would leave them."""
    target = make_target()
    direct, held = target.allocate_cache(2, 64), target.allocate_cache(2, 64)
    for cache in direct, held:
        _prefill(target, cache, PROMPTS)
    anchors = torch.tensor([5, 6])
    tree = chain_tree(anchors, torch.tensor([[7, 8, 9], [10, 11, 12]]))
    _verify(target, direct, PROMPTS, tree)
    nodes = NodeWrites(held)
    _, starts = _verify(target, nodes, PROMPTS, tree)
    nodes.commit(starts, None, tree.num_nodes)
    assert torch.equal(held.k, direct.k) and torch.equal(held.v, direct.v)


def _post_following(tree: Tree, targets: torch.Tensor) -> torch.Tensor:
    """Target tokens that walk from the root to `targets` and then leave the tree."""
    post = torch.full_like(tree.tokens, 47)  # the mask token: never a node token here
    for b in range(tree.tokens.shape[0]):
        path = _path(tree, b, int(targets[b]))
        for parent, child in zip(path, path[1:]):
            post[b, parent] = tree.tokens[b, child]
    return post


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_attend_equals_dense_reference_attention_with_gqa_and_ragged_prefixes(fused):
    gen = torch.Generator().manual_seed(0)
    b, hq, hkv, n, s, d = 3, 8, 2, 5, 11, 4
    q = torch.randn(b, hq, n, d, generator=gen)
    k_prefix, v_prefix = torch.randn(2, b, hkv, s, d, generator=gen)
    k_new, v_new = torch.randn(2, b, hkv, n, d, generator=gen)
    mask = torch.rand(b, n, n, generator=gen) < 0.5
    mask |= torch.eye(n, dtype=torch.bool)
    lens = torch.tensor([0, 4, 11])
    out = attend(q, (k_prefix, v_prefix), lens, k_new, v_new, mask, fused)
    keys = torch.cat([k_prefix, k_new], 2).repeat_interleave(hq // hkv, dim=1)
    values = torch.cat([v_prefix, v_new], 2).repeat_interleave(hq // hkv, dim=1)
    visible = torch.cat([(torch.arange(s) < lens[:, None])[:, None].expand(b, n, s), mask], -1)
    scores = (q @ keys.transpose(-1, -2)) / d**0.5
    expected = scores.masked_fill(~visible[:, None], float("-inf")).softmax(-1) @ values
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_fused_attention_gets_a_broadcast_length_bias_not_a_nodes_by_context_mask(monkeypatch):
    """The CUDA branch differs from the CPU one only in the kernel it calls (no CPU build of the
    memory-efficient kernel exists), so the bias view both are handed is checked here: the prefix
    part's is [B, 1, 1, S] storage with aligned rows, expanded with stride 0, never a
    [B, Hkv, G*N, S] tensor; and the result equals the reference in fp32."""
    handed = []
    flash = attention._flash_attention_cpu

    def recording(qg, k, v, mask):
        handed.append(mask)
        return flash(qg, k, v, mask)

    monkeypatch.setattr(attention, "_flash_attention_cpu", recording)
    gen = torch.Generator().manual_seed(3)
    b, hkv, rows, s, d = 3, 2, 4 * 5, 37, 8  # 4 query heads per KV head x 5 nodes; S not aligned
    qg, k, v = (torch.randn(b, hkv, n, d, generator=gen) for n in (rows, s, s))
    lens = torch.tensor([0, 9, 37])  # an empty prefix, a partial one, a full one
    bias = attention._additive(torch.arange(s) < lens[:, None])[:, None, None]  # [B, 1, 1, S]
    out, lse = attention._fused_partial(qg, k, v, bias)
    want_out, want_lse = attention._partial(qg, k, v, bias)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)  # -inf on the empty row
    (mask,) = handed
    assert mask.shape == (b, hkv, rows, s) and mask.stride()[1:] == (0, 0, 1)
    assert mask.untyped_storage().nbytes() == b * 48 * 4  # [B, 1, 1, 48] fp32: rows padded
    assert mask.stride(0) % 16 == 0


@pytest.mark.gpu
def test_fused_attend_on_cuda_equals_the_reference():
    gen = torch.Generator().manual_seed(1)
    b, hq, hkv, n, s, d = 3, 8, 2, 17, 301, 64  # odd sizes: the kernel pads rows and keys
    q = torch.randn(b, hq, n, d, generator=gen)
    k_prefix, v_prefix = torch.randn(2, b, hkv, s, d, generator=gen)
    k_new, v_new = torch.randn(2, b, hkv, n, d, generator=gen)
    mask = (torch.rand(b, n, n, generator=gen) < 0.5) | torch.eye(n, dtype=torch.bool)
    lens = torch.tensor([0, 40, 301])
    args = [x.cuda() for x in (q, k_prefix, v_prefix, lens, k_new, v_new, mask)]
    q, kp, vp, lens, kn, vn, mask = args
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        ref = attend(q.to(dtype), (kp.to(dtype), vp.to(dtype)), lens, kn.to(dtype),
                     vn.to(dtype), mask)
        fused = attend(q.to(dtype), (kp.to(dtype), vp.to(dtype)), lens, kn.to(dtype),
                       vn.to(dtype), mask, fused=True)
        torch.testing.assert_close(fused.float(), ref.float(), atol=tol, rtol=tol)
