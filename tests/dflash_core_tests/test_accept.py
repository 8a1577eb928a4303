"""The acceptance walk on hand-made trees (the cases of the DDTree correctness checklist)."""

from __future__ import annotations

import torch

from dflash_core.speculation.accept import accept
from dflash_core.speculation.tree import build_tree, chain_tree, tree_from_nodes

#        root(9)
#        /     \
#     a(1)     b(2)       depth 1 (b is the second sibling)
#      |        |
#     c(3)     d(4)       depth 2
#      |
#     e(5)                depth 3
NODES = [(1, 0, 1), (2, 0, 1), (3, 1, 2), (4, 2, 2), (5, 3, 3)]
TREE = tree_from_nodes(9, NODES, num_nodes=6)
MISS = 7  # a token no node holds


def _walk(post_by_node):
    post = torch.tensor([post_by_node])
    acc = accept(TREE, post, path_len=4)
    n = int(acc.lengths[0])
    return TREE.tokens[0, acc.path[0, :n]].tolist(), int(acc.bonus[0])


def test_mismatch_at_the_root_accepts_only_the_root():
    assert _walk([MISS] * 6) == ([9], MISS)


def test_full_depth_match_accepts_the_whole_path_and_takes_the_last_bonus():
    # post[i] is the target token after node i: root->1, node1->3, node3->5, node5->8
    assert _walk([1, 3, MISS, 5, MISS, 8]) == ([9, 1, 3, 5], 8)


def test_a_non_first_sibling_can_be_accepted():
    assert _walk([2, MISS, 4, MISS, 6, MISS]) == ([9, 2, 4], 6)


def test_root_only_tree_is_plain_decoding():
    tree = chain_tree(torch.tensor([5, 6]), torch.empty(2, 0, dtype=torch.long))
    acc = accept(tree, torch.tensor([[11], [12]]), path_len=1)
    assert acc.lengths.tolist() == [1, 1] and acc.bonus.tolist() == [11, 12]


def test_padding_nodes_are_never_accepted():
    padded = tree_from_nodes(9, NODES[:1], num_nodes=4)  # node tokens after 1 are padding (0)
    acc = accept(padded, torch.tensor([[1, 0, 0, 0]]), path_len=2)
    assert acc.lengths.tolist() == [2] and acc.bonus.tolist() == [0]


def test_a_tree_with_the_spine_never_accepts_less_than_the_chain():
    gen = torch.Generator().manual_seed(3)
    deep_rounds = 0
    for _ in range(50):
        logprobs = torch.randn(4, 5, 12, generator=gen).log_softmax(-1)  # [B, L, V]
        anchors = torch.zeros(4, dtype=torch.long)
        tree = build_tree(anchors, logprobs, budget=7, topk=3, max_depth=5, spine=True)
        chain = chain_tree(anchors, logprobs.argmax(-1))
        # The target agrees with the chain for a random number of steps, then goes elsewhere.
        target = torch.randint(0, 12, (4, 6), generator=gen)
        agree = torch.arange(6) < torch.randint(0, 6, (4, 1), generator=gen)  # [B, 6]
        target[:, :5] = torch.where(agree[:, :5], logprobs.argmax(-1), target[:, :5])
        post_tree = _target_tokens(tree, target)
        post_chain = _target_tokens(chain, target)
        tau_tree = accept(tree, post_tree, 6).lengths
        tau_chain = accept(chain, post_chain, 6).lengths
        assert (tau_tree >= tau_chain).all()
        deep_rounds += int((tau_chain > 2).sum())
    assert deep_rounds > 20  # the chain really accepted several tokens in many rounds


def _target_tokens(tree, target):
    """A target whose next token depends only on the depth (the same for every path)."""
    return target.gather(1, tree.depths)
