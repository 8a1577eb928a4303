"""DDTree draft trees: the heap against brute force, the vectorised builder against the heap."""

from __future__ import annotations

import random

import pytest
import torch

from dflash_core.speculation.tree import (
    Tree,
    ancestor_mask,
    build_tree,
    build_tree_heap,
    chain_tree,
    depth_logprobs,
    tree_from_nodes,
)

FIELDS = ("tokens", "parents", "depths", "valid", "mask")


# --- helpers ---------------------------------------------------------------------------------


def _logprobs(gen: torch.Generator, shape: tuple[int, ...], kind: str) -> torch.Tensor:
    """Random log-probs; `kind` picks how many exact ties and -inf entries they hold."""
    if kind == "continuous":
        logits = torch.randn(shape, generator=gen) * 2
    elif kind == "quantised":  # many exact ties, also at the top-K boundary
        logits = torch.randint(0, 3, shape, generator=gen).float()
    elif kind == "repeated":  # identical rows at every depth: ties between different paths
        logits = torch.randint(0, 3, shape[:-2] + (1, shape[-1]), generator=gen).float()
        logits = logits.expand(shape).clone()
    elif kind == "peaked":  # the top log-prob is exactly 0.0: children tie with their parents
        logits = torch.randn(shape, generator=gen)
        logits.scatter_(-1, torch.randint(0, shape[-1], shape[:-1] + (1,), generator=gen), 300.0)
    else:  # "masked": a vocabulary mask leaves fewer finite tokens than topk
        logits = torch.randn(shape, generator=gen)
        logits[torch.rand(shape, generator=gen) < 0.5] = -torch.inf
        logits[..., 0] = 0.0  # keep one finite token per row
    return logits.log_softmax(-1)


def _prefixes(nodes: list[tuple[int, int, int]]) -> list[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = [()]
    for token, parent, _ in nodes:
        paths.append(paths[parent] + (token,))
    return paths[1:]


def _lattice(logits: torch.Tensor, topk: int, max_depth: int) -> dict[tuple[int, ...], float]:
    """Every finite prefix of the restricted lattice with its float32 score, by enumeration:
    each depth's top-k by logit, scored by log-prob."""
    k, lp = min(topk, logits.shape[1]), depth_logprobs(logits)
    out: dict[tuple[int, ...], float] = {}
    frontier = [((), torch.tensor(0.0))]
    for d in range(min(max_depth, logits.shape[0])):
        top = sorted(range(logits.shape[1]), key=lambda t: (-logits[d, t].item(), t))[:k]
        frontier = [(p + (t,), s + lp[d, t]) for p, s in frontier for t in top]
        frontier = [(p, s) for p, s in frontier if torch.isfinite(s)]
        out.update((p, s.item()) for p, s in frontier)
    return out


def _brute_force(lp, budget, topk, max_depth, spine) -> set[tuple[int, ...]]:
    scores = _lattice(lp, topk, max_depth)
    chain = []
    if spine:
        greedy = max(scores, key=lambda p: (len(p), scores[p]), default=())
        chain = [greedy[:d] for d in range(1, min(len(greedy), budget) + 1)]
    rest = sorted((p for p in scores if p not in chain), key=lambda p: (-scores[p], len(p)))
    return set(chain) | set(rest[: budget - len(chain)])


def _node_scores(logits: torch.Tensor, nodes: list[tuple[int, int, int]]) -> list[float]:
    lp, scores = depth_logprobs(logits), [torch.tensor(0.0)]
    for token, parent, depth in nodes:
        scores.append(scores[parent] + lp[depth - 1, token])
    return [s.item() for s in scores[1:]]


def _root_path(parents: list[int], i: int) -> set[int]:
    path = set()
    while i >= 0:
        path.add(i)
        i = parents[i]
    return path


def _random_case(rng: random.Random, max_len: int, max_vocab: int, max_budget: int):
    seq, vocab = rng.randint(1, max_len), rng.randint(2, max_vocab)
    return dict(
        shape=(seq, vocab),
        budget=rng.randint(0, max_budget),
        topk=rng.randint(1, vocab + 1),
        max_depth=rng.randint(0, seq + 1),
        spine=rng.random() < 0.5,
    )


def _assert_equal_to_heap(anchors, lp, budget, topk, max_depth, spine) -> Tree:
    tree = build_tree(anchors, lp, budget, topk, max_depth, spine)
    assert tree.num_nodes == budget + 1
    for b in range(lp.shape[0]):
        nodes = build_tree_heap(int(anchors[b]), lp[b], budget, topk, max_depth, spine)
        ref = tree_from_nodes(int(anchors[b]), nodes, budget + 1)
        for field in FIELDS:
            got, want = getattr(tree, field)[b], getattr(ref, field)[0]
            assert torch.equal(got, want), (field, b, got, want)
    return tree


# --- the heap reference ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["continuous", "masked"])
def test_heap_matches_brute_force(kind):
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    for _ in range(120):
        case = _random_case(rng, max_len=4, max_vocab=6, max_budget=30)
        lp = _logprobs(gen, case.pop("shape"), kind)
        nodes = build_tree_heap(5, lp, **case)
        prefixes = _prefixes(nodes)
        lattice = _lattice(lp, case["topk"], case["max_depth"])
        assert len(nodes) == min(case["budget"], len(lattice))
        assert set(prefixes) == _brute_force(lp, **case)
        assert len(set(prefixes)) == len(prefixes)  # siblings hold distinct tokens


def test_heap_order_and_shape():
    rng, gen = random.Random(2), torch.Generator().manual_seed(2)
    for _ in range(150):
        case = _random_case(rng, max_len=5, max_vocab=6, max_budget=40)
        lp = _logprobs(gen, case.pop("shape"), rng.choice(["continuous", "peaked", "masked"]))
        nodes = build_tree_heap(0, lp, **case)
        spine_len = 0
        while case["spine"] and spine_len < len(nodes) and nodes[spine_len][1:] == (
            spine_len,
            spine_len + 1,
        ):
            spine_len += 1
        scores = _node_scores(lp, nodes)[spine_len:]
        assert all(a >= b for a, b in zip(scores, scores[1:]))
        for i, (_, parent, depth) in enumerate(nodes, start=1):
            assert 0 <= parent < i
            assert depth == (nodes[parent - 1][2] + 1 if parent else 1)
            assert depth <= case["max_depth"]


def test_spine_brute_force_differs_from_plain_tree():
    """Flat distributions: the plain tree stays shallow, the spine still reaches full depth."""
    lp = torch.tensor([[0.0, 0.01, 0.02, 0.03, 0.04, 0.05]]).expand(4, 6).log_softmax(-1)
    plain = build_tree_heap(0, lp, budget=6, topk=6, max_depth=4, spine=False)
    spined = build_tree_heap(0, lp, budget=6, topk=6, max_depth=4, spine=True)
    assert {d for _, _, d in plain} == {1}
    assert _prefixes(spined) == [(5,), (5, 5), (5, 5, 5), (5, 5, 5, 5), (4,), (3,)]
    assert set(_prefixes(spined)) == _brute_force(lp, 6, 6, 4, True)


# --- vectorised == heap -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["continuous", "quantised", "repeated", "peaked", "masked"])
def test_vectorised_matches_heap(kind, dtype):
    """bf16 logits take the int32 ranking key, float32 ones the int64 key."""
    rng, gen = random.Random(3), torch.Generator().manual_seed(3)
    for _ in range(60):
        case = _random_case(rng, max_len=6, max_vocab=8, max_budget=40)
        batch = rng.randint(1, 4)
        lp = _logprobs(gen, (batch, *case.pop("shape")), kind).to(dtype)
        anchors = torch.randint(0, 100, (batch,), generator=gen)
        _assert_equal_to_heap(anchors, lp, **case)


@pytest.mark.parametrize("kind", ["continuous", "quantised", "masked"])
def test_bf16_logits_rank_as_their_float32_values(kind):
    """The int32 key of bf16 logits orders tokens exactly like the int64 key of the same
    values in float32: signs, -inf, -0.0 and the many ties of a 16-bit float included."""
    gen = torch.Generator().manual_seed(10)
    logits = (_logprobs(gen, (3, 5, 300), kind) * 40).bfloat16()
    logits[0, 0, :4] = torch.tensor([-0.0, 0.0, -0.0, 1e-30])  # 1e-30 rounds to a bf16 > 0
    logits[1, 1] = logits[1, 1].clamp(max=-1.0)  # a row of negatives only
    wide = logits.float()
    for budget, topk in ((24, 4), (40, 8)):
        anchors = torch.tensor([1, 2, 3])
        got = build_tree(anchors, logits, budget, topk, 5, True)
        want = build_tree(anchors, wide, budget, topk, 5, True)
        for field in FIELDS:
            assert torch.equal(getattr(got, field), getattr(want, field)), field


def test_vectorised_pads_when_lattice_is_small():
    lp = torch.randn(2, 2, 3, generator=torch.Generator().manual_seed(4)).log_softmax(-1)
    tree = _assert_equal_to_heap(torch.tensor([7, 9]), lp, 20, topk=2, max_depth=2, spine=True)
    assert tree.valid.sum(1).tolist() == [7, 7]  # root + 2 + 2 * 2
    assert (tree.tokens[:, 7:] == 0).all() and (tree.parents[:, 7:] == -1).all()
    assert (tree.depths[:, 7:] == 0).all() and not tree.valid[:, 7:].any()


def test_rows_of_a_batch_are_independent():
    gen = torch.Generator().manual_seed(5)
    lp = _logprobs(gen, (3, 4, 7), "continuous")
    batched = build_tree(torch.tensor([1, 2, 3]), lp, 12, 4, 4, False)
    for b in range(3):
        alone = build_tree(torch.tensor([b + 1]), lp[b : b + 1], 12, 4, 4, False)
        for field in FIELDS:
            assert torch.equal(getattr(batched, field)[b], getattr(alone, field)[0])
    assert not torch.equal(batched.tokens[0], batched.tokens[1])


def test_ties_break_by_token_id_and_signed_zero():
    lp = torch.tensor([[-0.0, 0.0, -1.0, 0.0]])  # three ways to score 0.0
    for build in (
        lambda s: build_tree(torch.tensor([9]), lp[None], 2, 2, 1, s).tokens[0, 1:].tolist(),
        lambda s: [t for t, _, _ in build_tree_heap(9, lp, 2, 2, 1, s)],
    ):
        assert build(False) == [0, 1] and build(True) == [0, 1]


def test_peaked_ties_keep_parents_before_children():
    gen = torch.Generator().manual_seed(6)
    lp = _logprobs(gen, (2, 5, 6), "peaked")
    assert (lp.max(-1).values == 0.0).all()  # every depth ties the greedy child with its parent
    for spine in (False, True):
        tree = _assert_equal_to_heap(torch.tensor([3, 4]), lp, 24, 3, 5, spine)
        idx = torch.arange(tree.num_nodes)
        real = tree.valid & (idx > 0)
        assert (tree.parents[real] < idx.expand_as(real)[real]).all()
        assert tree.depths[:, 1:6].tolist() == [[1, 2, 3, 4, 5]] * 2  # the zero-cost chain leads


def test_spine_contains_greedy_chain():
    rng, gen = random.Random(7), torch.Generator().manual_seed(7)
    for _ in range(40):
        seq, vocab, budget = rng.randint(1, 6), rng.randint(2, 8), rng.randint(1, 10)
        max_depth = rng.randint(1, seq)
        lp = _logprobs(gen, (2, seq, vocab), "continuous")
        tree = build_tree(torch.tensor([0, 1]), lp, budget, rng.randint(1, vocab), max_depth, True)
        chain = min(budget, max_depth)
        assert torch.equal(tree.tokens[:, 1 : chain + 1], lp[:, :chain].argmax(-1))
        assert tree.parents[:, 1 : chain + 1].tolist() == [list(range(chain))] * 2
        assert tree.depths[:, 1 : chain + 1].tolist() == [list(range(1, chain + 1))] * 2


def test_no_host_sync():
    """Meta tensors hold no data: any .item(), .tolist() or data-dependent shape would raise."""
    lp = torch.empty(3, 6, 50, device="meta")
    tree = build_tree(torch.empty(3, dtype=torch.long, device="meta"), lp, 32, 8, 6, True)
    assert tree.tokens.shape == (3, 33) and tree.mask.shape == (3, 33, 33)


# --- masks, chains, degenerate trees ----------------------------------------------------------


def test_mask_invariants():
    rng, gen = random.Random(8), torch.Generator().manual_seed(8)
    for _ in range(40):
        case = _random_case(rng, max_len=6, max_vocab=6, max_budget=30)
        lp = _logprobs(gen, (2, *case.pop("shape")), rng.choice(["continuous", "masked"]))
        tree = build_tree(torch.tensor([1, 2]), lp, **case)
        n, mask = tree.num_nodes, tree.mask
        assert not (mask & ~torch.ones(n, n, dtype=torch.bool).tril()).any()
        assert mask.diagonal(dim1=1, dim2=2).all()
        assert torch.equal(mask.sum(-1)[tree.valid], tree.depths[tree.valid] + 1)
        assert (mask.sum(-1)[~tree.valid] == 1).all()
        for b in range(2):
            parents = tree.parents[b].tolist()
            for i in range(n):
                assert set(mask[b, i].nonzero().flatten().tolist()) == _root_path(parents, i)


def test_ancestor_mask_needs_only_log_depth_doublings():
    parents = torch.tensor([[-1, 0, 1, 2, 3, 4, 5, 6, 7, -1]])
    valid = torch.tensor([[True] * 9 + [False]])
    mask = ancestor_mask(parents, valid, 8)
    want = torch.ones(10, 10, dtype=torch.bool).tril()
    want[9, :9] = False
    assert torch.equal(mask[0], want)
    assert not ancestor_mask(parents, valid, 4)[0, 8, 0]  # too small a bound misses the root


def test_chain_tree():
    tree = chain_tree(torch.tensor([5, 6]), torch.tensor([[1, 2, 3], [4, 5, 6]]))
    assert tree.tokens.tolist() == [[5, 1, 2, 3], [6, 4, 5, 6]]
    assert tree.parents.tolist() == [[-1, 0, 1, 2]] * 2
    assert tree.depths.tolist() == [[0, 1, 2, 3]] * 2
    assert tree.valid.all() and tree.num_nodes == 4
    assert torch.equal(tree.mask, torch.ones(2, 4, 4, dtype=torch.bool).tril().expand(2, 4, 4))


@pytest.mark.parametrize(
    "tree",
    [
        chain_tree(torch.tensor([5, 6]), torch.zeros(2, 0, dtype=torch.long)),
        build_tree(torch.tensor([5, 6]), torch.zeros(2, 3, 4).log_softmax(-1), 0, 4, 3, True),
        build_tree(torch.tensor([5, 6]), torch.zeros(2, 0, 4), 0, 4, 3, False),
    ],
)
def test_root_only(tree):
    assert tree.num_nodes == 1
    assert tree.tokens.tolist() == [[5], [6]] and tree.parents.tolist() == [[-1], [-1]]
    assert tree.valid.all() and tree.mask.all() and (tree.depths == 0).all()


@pytest.mark.parametrize("budget, topk, max_depth", [(4, 4, 0), (4, 0, 3)])
def test_empty_lattice_is_root_plus_padding(budget, topk, max_depth):
    lp = torch.zeros(2, 3, 4).log_softmax(-1)
    tree = _assert_equal_to_heap(torch.tensor([5, 6]), lp, budget, topk, max_depth, False)
    assert tree.valid.tolist() == [[True] + [False] * budget] * 2


def test_tree_from_nodes_rejects_overflow():
    with pytest.raises(ValueError):
        tree_from_nodes(0, [(1, 0, 1), (2, 1, 2)], 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu_and_captures_in_a_graph():
    gen = torch.Generator().manual_seed(9)
    lp, anchors = _logprobs(gen, (4, 7, 1000), "quantised"), torch.arange(4)
    cpu = build_tree(anchors, lp, 48, 8, 7, True)
    lp_gpu, anchors_gpu = lp.cuda(), anchors.cuda()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm up off the default stream, as capture requires
        build_tree(anchors_gpu, lp_gpu, 48, 8, 7, True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gpu = build_tree(anchors_gpu, lp_gpu, 48, 8, 7, True)
    graph.replay()
    for field in FIELDS:
        assert torch.equal(getattr(gpu, field).cpu(), getattr(cpu, field))
