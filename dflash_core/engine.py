"""The generate loop: prefill, then rounds of draft -> build tree -> verify -> accept -> commit.

Plain decoding is the same loop with a root-only tree, DFlash a chain, DDTree a best-first tree,
so all three share one verify and one commit. A static batch of requests moves through rounds
together; each request keeps its own committed length and finishes on its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from dflash_core.accept import accept
from dflash_core.kv_cache import KVCache
from dflash_core.proposer import DraftInput, Proposer
from dflash_core.sampling import sample
from dflash_core.spec import SamplingParams, Spec
from dflash_core.stats import Generation, GenerationStats
from dflash_core.step import Step
from dflash_core.target import Target
from dflash_core.tree import Tree, build_tree, chain_tree


@dataclass(slots=True)
class EngineConfig:
    max_batch: int = 8
    max_context: int = 4096  # prompt + generated tokens per request
    max_tree_nodes: int = 64  # largest verify per request (root included); sizes the cache

    def __post_init__(self) -> None:
        if min(self.max_batch, self.max_context, self.max_tree_nodes) < 1:
            raise ValueError("engine limits must be >= 1")


@dataclass(slots=True)
class _Requests:
    """Device state (tensors) and its host mirror for one generate call."""

    prompt_lens: list[int]
    starts_h: list[int]  # committed length = position of the anchor
    starts: Tensor  # [B]
    anchors: Tensor  # [B]
    features: Tensor  # [B, C, F] target features of positions committed since the last draft
    feature_positions: Tensor  # [B, C]
    outputs: list[list[int]]
    finish: list[str | None]

    def active(self) -> list[int]:
        return [b for b, reason in enumerate(self.finish) if reason is None]


class Engine:
    def __init__(self, target: Target, proposer: Proposer | None = None,
                 config: EngineConfig | None = None) -> None:
        self.target, self.proposer = target, proposer
        self.config = config or EngineConfig()
        self.taps = list(proposer.tap_layers) if proposer else []
        self.capacity = self.config.max_context + self.config.max_tree_nodes
        self.device = target.lm_head.weight.device
        self.cache = target.allocate_cache(self.config.max_batch, self.capacity)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], sampling: SamplingParams | None = None,
                 spec: Spec | None = None) -> Generation:
        sampling, spec = sampling or SamplingParams(), spec or Spec.none()
        self._check(prompts, spec)
        stats, began = GenerationStats(), time.perf_counter()
        generator = torch.Generator(self.device).manual_seed(sampling.seed)
        cache = self.cache.row_range(len(prompts))
        if self.proposer is not None:
            self.proposer.begin(len(prompts), self.capacity)
        with stats.timed("prefill", self.device):
            reqs = self._prefill(prompts, sampling, generator, cache)
        while reqs.active():
            self._round(reqs, spec, sampling, generator, cache, stats)
        stats.wall_s = time.perf_counter() - began
        stats.generated_tokens = sum(map(len, reqs.outputs))
        return Generation(reqs.outputs, reqs.finish, stats)

    def _check(self, prompts: list[list[int]], spec: Spec) -> None:
        cfg = self.config
        if not 1 <= len(prompts) <= cfg.max_batch:
            raise ValueError(f"need 1..{cfg.max_batch} prompts, got {len(prompts)}")
        if any(not 1 <= len(p) < cfg.max_context for p in prompts):
            raise ValueError(f"every prompt needs 1..{cfg.max_context - 1} tokens")
        vocab = self.target.config.vocab_size
        if any(not 0 <= t < vocab for p in prompts for t in p):
            raise ValueError(f"prompt token ids must be in 0..{vocab - 1}")
        if spec.num_nodes > cfg.max_tree_nodes:
            raise ValueError(f"{spec} verifies {spec.num_nodes} nodes > max_tree_nodes "
                             f"{cfg.max_tree_nodes}")
        if spec.method != "none" and self.proposer is None:
            raise ValueError(f"spec {spec.method!r} needs a drafter")
        if spec.method != "none" and spec.block_size > self.proposer.block_size:
            raise ValueError(f"block_size {spec.block_size} > the drafter's trained block "
                             f"{self.proposer.block_size}")

    def _prefill(self, prompts: list[list[int]], sampling: SamplingParams,
                 generator: torch.Generator, cache: KVCache) -> _Requests:
        """One causal forward over right-padded prompts: a real token never sees the padding
        after it, and padding K/V land past the row's prefix, hidden by its length mask until
        rounds overwrite them."""
        lens = [len(p) for p in prompts]
        longest = max(lens)
        ids = self._tensor([p + [0] * (longest - len(p)) for p in prompts])  # [B, P]
        zeros = torch.zeros(len(prompts), dtype=torch.long, device=self.device)
        hidden, features = self.target(ids, Step.causal(zeros, longest, 0), cache,
                                       self.taps)  # [B, P, *]
        last = hidden[torch.arange(len(prompts), device=self.device), self._tensor(lens) - 1]
        anchors = sample(self.target.logits(last), sampling, generator)  # [B]
        reqs = _Requests(lens, list(lens), self._tensor(lens), anchors, features,
                         torch.arange(longest, device=self.device).expand(len(prompts), -1),
                         [[] for _ in prompts], [None] * len(prompts))
        for b, token in enumerate(anchors.tolist()):
            self._emit(reqs, b, [token], sampling)
        return reqs

    def _round(self, reqs: _Requests, spec: Spec, sampling: SamplingParams,
               generator: torch.Generator, cache: KVCache, stats: GenerationStats) -> None:
        with stats.timed("draft", self.device):
            draft_logits = self._draft(reqs, spec)  # [B, L, V] or None
        with stats.timed("build", self.device):
            tree = self._tree(reqs.anchors, draft_logits, spec)
        with stats.timed("verify", self.device):
            post, features = self._verify(reqs, tree, sampling, generator, cache)
        with stats.timed("commit", self.device):
            self._commit(reqs, tree, post, features, spec, sampling, cache, stats)

    def _draft(self, reqs: _Requests, spec: Spec) -> Tensor | None:
        if spec.method == "none":
            return None
        return self.proposer.propose(DraftInput(
            reqs.features, reqs.feature_positions, reqs.anchors, reqs.starts,
            max(reqs.starts_h), spec.block_size))

    def _tree(self, anchors: Tensor, draft_logits: Tensor | None, spec: Spec) -> Tree:
        if spec.method == "none":
            return chain_tree(anchors, anchors[:, None][:, :0])
        if spec.method == "dflash":
            return chain_tree(anchors, draft_logits.argmax(-1))
        # Width above the budget cannot change the tree (a child ranked below `budget` has
        # `budget` better siblings), so cap it: the candidate set is budget x width per depth.
        width = min(spec.width or spec.budget, spec.budget)
        return build_tree(anchors, draft_logits.float().log_softmax(-1), spec.budget, width,
                          spec.max_depth, spec.spine)

    def _verify(self, reqs: _Requests, tree: Tree, sampling: SamplingParams,
                generator: torch.Generator, cache: KVCache) -> tuple[Tensor, Tensor]:
        """One target forward over every node of every request -> target token per node."""
        nodes = torch.arange(tree.num_nodes, device=self.device)
        step = Step(reqs.starts[:, None] + tree.depths, reqs.starts[:, None] + nodes,
                    reqs.starts, max(reqs.starts_h), tree.mask)
        hidden, features = self.target(tree.tokens, step, cache, self.taps)  # [B,N,H], [B,N,F]
        return sample(self.target.logits(hidden), sampling, generator), features  # [B, N]

    def _commit(self, reqs: _Requests, tree: Tree, post: Tensor, features: Tensor, spec: Spec,
                sampling: SamplingParams, cache: KVCache, stats: GenerationStats) -> None:
        acc = accept(tree, post, spec.max_depth + 1)
        cache.commit(reqs.starts, acc.path)
        reqs.features = features.gather(1, acc.path[..., None].expand(-1, -1, features.shape[-1]))
        reqs.feature_positions = reqs.starts[:, None] + torch.arange(acc.path.shape[1],
                                                                     device=self.device)
        accepted = tree.tokens.gather(1, acc.path)  # [B, A]
        host = torch.cat([acc.lengths[:, None], acc.bonus[:, None], accepted], 1).tolist()
        stats.rounds += 1
        for b in reqs.active():  # the round's one host sync is the .tolist() above
            length, bonus, path_tokens = host[b][0], host[b][1], host[b][2:]
            stats.acceptance[length] += 1
            reqs.starts_h[b] += length
            self._emit(reqs, b, path_tokens[1:length] + [bonus], sampling)
        reqs.anchors = acc.bonus
        # Finished rows restart at slot 0 so their (ignored) work never runs past the cache.
        reqs.starts_h = [s if f is None else 0 for s, f in zip(reqs.starts_h, reqs.finish)]
        reqs.starts = self._tensor(reqs.starts_h)

    def _emit(self, reqs: _Requests, b: int, tokens: list[int], sampling: SamplingParams) -> None:
        out = reqs.outputs[b]
        for token in tokens:
            out.append(token)
            if token in sampling.stop_token_ids:
                reqs.finish[b] = "stop"
            elif len(out) >= sampling.max_tokens:
                reqs.finish[b] = "max_tokens"
            elif reqs.prompt_lens[b] + len(out) >= self.config.max_context:
                reqs.finish[b] = "length"
            if reqs.finish[b]:
                return

    def _tensor(self, values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)
