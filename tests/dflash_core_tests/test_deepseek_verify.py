"""Tree verify on the DeepSeek-V3 layout (MLA + latent cache, dense layer first then MoE): every
node sees exactly its root path, commit leaves a causal forward's cache, greedy DFlash / DDTree
equal plain greedy, and the latent prefix is read once for all nodes and heads."""

from __future__ import annotations

import pytest
import torch
from core_helpers import BLOCK, PROMPTS, host_sync_ops
from deepseek_helpers import kimi_drafter, make_deepseek
from test_verify import (
    _post_following,
    _prefill,
    _random_tree,
    _verify,
    assert_cache_holds_the_accepted_tokens,
    assert_nodes_see_their_root_paths,
)
from torch.utils._python_dispatch import TorchDispatchMode

from dflash_core import (
    AcceptanceProfile,
    DFlashProposer,
    Engine,
    EngineConfig,
    OracleProposer,
    SamplingParams,
    Spec,
)
from dflash_core.models.cache import NodeWrites
from dflash_core.models.latent_cache import LatentCache
from dflash_core.models.step import Step
from dflash_core.speculation.accept import accept

VERIFY_PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1]]
VARIANTS = [pytest.param({}, id="bf16-experts"), pytest.param({"int4": True}, id="int4-experts"),
            pytest.param({"q_lora": False, "yarn": False}, id="no-qlora-no-yarn")]


@pytest.mark.parametrize("options", VARIANTS)
@pytest.mark.parametrize("budget", [3, 12])
def test_each_mla_tree_node_sees_exactly_its_root_path(options, budget):
    target = make_deepseek(**options)
    cache = target.allocate_cache(2, 64)
    assert isinstance(cache, LatentCache)
    assert_nodes_see_their_root_paths(target, cache, VERIFY_PROMPTS, budget)


def test_latent_commit_leaves_the_cache_of_a_causal_forward():
    target = make_deepseek()
    cache = target.allocate_cache(2, 64)
    _prefill(target, cache, VERIFY_PROMPTS)
    tree = _random_tree(2, 12, seed=7)
    nodes = NodeWrites(cache)
    _, starts = _verify(target, nodes, VERIFY_PROMPTS, tree)
    deepest = tree.depths.masked_fill(~tree.valid, -1).argmax(-1)
    acc = accept(tree, _post_following(tree, deepest), path_len=5)
    nodes.commit(starts, acc.path, 5)
    assert_cache_holds_the_accepted_tokens(target, cache, VERIFY_PROMPTS, tree, acc,
                                           field_names=("kv",))


# --- lossless greedy speculation ----------------------------------------------------------------

SPECS = [pytest.param(Spec.dflash(BLOCK), id="dflash-6"),
         pytest.param(Spec.ddtree(BLOCK, 4), id="ddtree-b4"),
         pytest.param(Spec.ddtree(BLOCK, 24, topk=3, spine=True), id="ddtree-b24-k3-spine")]
GREEDY = SamplingParams(max_tokens=20)


@pytest.fixture(scope="module", params=[{}, {"int4": True}], ids=["bf16", "int4"])
def kimi_engine(request):
    target = make_deepseek(**request.param)
    proposer = DFlashProposer(kimi_drafter(), target)
    return Engine(target, proposer, EngineConfig(max_batch=4, max_context=96, max_tree_nodes=32))


@pytest.fixture(scope="module")
def kimi_plain(kimi_engine):
    return kimi_engine.generate(PROMPTS, GREEDY, Spec.none())


@pytest.mark.parametrize("spec", SPECS)
def test_deepseek_speculative_greedy_equals_plain_greedy_with_mixed_lengths(kimi_engine,
                                                                            kimi_plain, spec):
    result = kimi_engine.generate(PROMPTS, GREEDY, spec)
    assert result.tokens == kimi_plain.tokens
    assert all(len(t) == GREEDY.max_tokens for t in result.tokens)


def test_deepseek_plain_batch_equals_each_request_alone(kimi_engine, kimi_plain):
    for prompt, expected in zip(PROMPTS, kimi_plain.tokens):
        assert kimi_engine.generate([prompt], GREEDY, Spec.none()).tokens == [expected]


def test_deepseek_verify_never_syncs():
    target = make_deepseek()
    cache = target.allocate_cache(2, 64)
    _prefill(target, cache, VERIFY_PROMPTS)
    tree = _random_tree(2, 8, seed=3)
    starts = torch.tensor([len(p) for p in VERIFY_PROMPTS])
    step = Step(starts[:, None] + tree.depths, starts[:, None] + torch.arange(tree.num_nodes),
                starts, 8, tree.mask)
    with torch.no_grad():
        assert host_sync_ops(lambda: target(tree.tokens, step, cache)) == set()


# --- the latent prefix is read once -------------------------------------------------------------

_VIEWS = frozenset({"aten.view", "aten.slice", "aten.select", "aten.transpose", "aten.t",
                    "aten.expand", "aten.unsqueeze", "aten.squeeze", "aten.alias",
                    "aten.as_strided", "aten._unsafe_view", "aten.permute", "aten.detach"})


class _CacheReads(TorchDispatchMode):
    """Every non-view op that takes the cache's storage as an input, with its input shapes, and
    the shapes of every op output."""

    def __init__(self, storage_ptr: int) -> None:
        super().__init__()
        self.ptr, self.reads, self.outputs = storage_ptr, [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if name not in _VIEWS and any(t.untyped_storage().data_ptr() == self.ptr
                                      for t in tensors):
            self.reads.append((name, [tuple(t.shape) for t in tensors]))
        self.outputs += [tuple(o.shape) for o in (out if isinstance(out, tuple) else (out,))
                         if isinstance(o, torch.Tensor)]
        return out


def test_mla_verify_reads_the_latent_prefix_once_for_all_nodes_and_heads():
    """Per layer, the prefix latents [B, 1, S, R + Dr] are the keys of one batched matmul whose
    rows are all heads x all nodes ([B, 1, H * N, R + Dr]), and the values of one more over the
    same storage (the probabilities times the latents); the only other use is writing the new
    nodes. No per-head K or V ([.., S, Dn], [.., S, Dv] or [.., S, H * (Dn + Dv)]) is built
    for the prefix."""
    target = make_deepseek()
    cfg = target.config
    cache = target.allocate_cache(2, 64)
    prompts = [list(range(1, 30)), list(range(2, 19))]  # prefix read S = 29
    _prefill(target, cache, prompts)
    tree = _random_tree(2, 7, seed=4)
    heads, nodes, width = cfg.num_attention_heads, tree.num_nodes, cfg.kv_lora_rank + 6
    recorder = _CacheReads(cache.kv.untyped_storage().data_ptr())
    with torch.no_grad(), recorder:
        _verify(target, cache, prompts, tree)
    layers = cfg.num_hidden_layers
    reads = [shapes for name, shapes in recorder.reads if name == "aten.bmm"]
    assert len(reads) == 2 * layers  # one for the scores, one for the values, per layer
    scores = [s for s in reads if s[1] == (2, width, 29)]  # the keys, transposed
    values = [s for s in reads if s[1] == (2, 29, width)]
    assert len(scores) == len(values) == layers
    assert all(s[0] == (2, heads * nodes, width) for s in scores)  # every head and node at once
    assert all(s[0] == (2, heads * nodes, 29) for s in values)
    others = {name for name, _ in recorder.reads} - {"aten.bmm"}
    assert others <= {"aten.index_copy_"}, others  # writing the new nodes
    per_head = {cfg.qk_nope_head_dim, cfg.v_head_dim,
                heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)}
    expanded = [s for s in recorder.outputs if 29 in s and per_head & set(s)]
    assert expanded == []


@pytest.mark.parametrize("spec", SPECS)
def test_deepseek_steered_drafts_accept_deep_and_stay_lossless(spec):
    """Drafts that are mostly right: long paths are accepted and committed in the latent cache."""
    target = make_deepseek()
    config = EngineConfig(max_batch=4, max_context=96, max_tree_nodes=32)
    references = Engine(target, None, config).generate(PROMPTS, SamplingParams(max_tokens=40))
    full = [p + r for p, r in zip(PROMPTS, references.tokens)]
    oracle = OracleProposer(full, target.config.vocab_size, BLOCK,
                            AcceptanceProfile.constant(BLOCK - 1, 0.75, 0.2))
    result = Engine(target, oracle, config).generate(PROMPTS, GREEDY, spec)
    assert result.tokens == [r[: GREEDY.max_tokens] for r in references.tokens]
    assert max(result.stats.acceptance) > 2
