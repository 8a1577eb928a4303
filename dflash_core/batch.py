"""A live batch: requests join free rows at any round and leave when done (continuous batching).

Each row of the engine's static cache holds at most one request. `admit` prefills new requests
into free rows; `step` runs one round (draft -> build -> verify -> accept -> commit) for every
row and returns what each live request emitted. `Engine.generate` is admit-all-then-step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dflash_core.accept import accept
from dflash_core.kv_cache import KVCache
from dflash_core.proposer import DraftInput, Proposer
from dflash_core.sampling import sample_rows
from dflash_core.shapes import RoundShapes
from dflash_core.spec import SamplingParams, Spec
from dflash_core.stats import GenerationStats
from dflash_core.step import Step
from dflash_core.target import Target
from dflash_core.tree import Tree, build_tree, chain_tree


@dataclass(slots=True)
class Request:
    prompt_len: int
    sampling: SamplingParams
    output: list[int]
    finish: str | None = None  # "stop", "max_tokens" or "length" once done


@dataclass(slots=True)
class Emitted:
    row: int
    tokens: list[int]
    finish: str | None


class LiveBatch:
    def __init__(self, target: Target, proposer: Proposer | None, cache: KVCache, spec: Spec,
                 max_context: int, taps: list[int], seed: int = 0,
                 shapes: RoundShapes = RoundShapes(), stage_timing: bool = True,
                 fused_attention: bool = False) -> None:
        self.target, self.proposer, self.cache, self.spec = target, proposer, cache, spec
        self.max_context, self.taps = max_context, taps
        self.shapes, self.stage_timing = shapes, stage_timing
        self.fused = fused_attention
        self.device = target.lm_head.weight.device
        rows = cache.k.shape[1]
        self.requests: list[Request | None] = [None] * rows
        self.starts_h = [0] * rows  # committed length = position of the anchor, per row
        self.anchors = torch.zeros(rows, dtype=torch.long, device=self.device)
        width = target.config.hidden_size * len(taps)
        self.features = torch.zeros(rows, 1, width, dtype=cache.k.dtype, device=self.device)
        self.feature_positions = torch.zeros(rows, 1, dtype=torch.long, device=self.device)
        self.generator = torch.Generator(self.device).manual_seed(seed)
        self.stats = GenerationStats()
        if proposer is not None:
            proposer.begin(rows, cache.capacity)

    # --- rows -------------------------------------------------------------------------------

    def live_rows(self) -> list[int]:
        return [b for b, r in enumerate(self.requests) if r is not None and r.finish is None]

    def free_rows(self) -> list[int]:
        return [b for b, r in enumerate(self.requests) if r is None or r.finish is not None]

    def release(self, row: int) -> None:
        """Forget a finished (or abandoned) request so its row can be reused."""
        self.requests[row] = None
        self.starts_h[row] = 0

    # --- admission ----------------------------------------------------------------------------

    def admit(self, prompts: list[list[int]], samplings: list[SamplingParams]) -> list[Emitted]:
        """Prefill new requests into free rows; returns their first token (sampled from the
        prefill logits) keyed by row."""
        if not prompts:
            return []
        rows = self.free_rows()[: len(prompts)]
        if len(rows) < len(prompts):
            raise ValueError(f"{len(prompts)} requests but only {len(rows)} free rows")
        with self.stats.timed("prefill", self.device, self.stage_timing):
            first = self._prefill(rows, prompts, samplings)
        events = []
        for b, prompt, sampling, token in zip(rows, prompts, samplings, first):
            self.requests[b] = Request(len(prompt), sampling, [])
            self.starts_h[b] = len(prompt)
            events.append(Emitted(b, *self._emit(b, [token])))
        return events

    def _prefill(self, rows: list[int], prompts: list[list[int]],
                 samplings: list[SamplingParams]) -> list[int]:
        """One causal forward over the right-padded prompts into a scratch cache, copied into
        the rows; padding never reaches a real token and lands past each prefix."""
        lens = [len(p) for p in prompts]
        longest, n = max(lens), len(prompts)
        ids = self._tensor([p + [0] * (longest - len(p)) for p in prompts])  # [n, P]
        scratch = self.target.allocate_cache(n, longest)
        zeros = torch.zeros(n, dtype=torch.long, device=self.device)
        hidden, features = self.target(ids, Step.causal(zeros, longest, 0, self.fused), scratch, self.taps)
        index = self._tensor(rows)
        self.cache.k[:, index, :, :longest] = scratch.k
        self.cache.v[:, index, :, :longest] = scratch.v
        last = hidden[torch.arange(n, device=self.device), self._tensor(lens) - 1]  # [n, H]
        first = sample_rows(self.target.logits(last)[:, None], samplings, self.generator)[:, 0]
        self.anchors[index] = first
        self._queue_context(index, features, torch.arange(longest, device=self.device))
        return first.tolist()

    def _queue_context(self, index: Tensor, features: Tensor, positions: Tensor) -> None:
        """Make `features` ([n, C, F] at `positions` [C]) the next drafter context of rows
        `index`, widening everyone's pending context to the longest (padding lands past each
        prefix and is clamped inside the cache)."""
        width = max(self.features.shape[1], features.shape[1])
        self.features = _pad_to(self.features, width)
        self.feature_positions = _extend_positions(self.feature_positions, width)
        self.features[index] = _pad_to(features.to(self.features.dtype), width)
        self.feature_positions[index] = _extend_positions(positions.expand(len(index), -1), width)
        self.feature_positions.clamp_(max=self.cache.capacity - 1)

    # --- one round ----------------------------------------------------------------------------

    def step(self) -> list[Emitted]:
        """One round over rows 0..n-1, n = the last live row + 1 rounded up to a batch bucket:
        a server at low load does not pay for its idle rows (rows are handed out lowest
        first)."""
        live = self.live_rows()
        if not live:
            return []
        n = self.shapes.rows(max(live) + 1, len(self.requests))
        full = (self.cache, self.anchors, self.features, self.feature_positions)
        self.cache = self.cache.row_range(n)
        self.anchors, self.features, self.feature_positions = (x[:n] for x in full[1:])
        try:
            return self._round(self._tensor(self.starts_h[:n]))
        finally:
            rows = full[1].shape[0]
            self.cache = full[0]
            self.anchors = torch.cat([self.anchors, full[1][n:]])
            # Rows past n hold no live request: their pending context is never drafted from.
            self.features = _pad_rows(self.features, rows)
            self.feature_positions = _pad_rows(self.feature_positions, rows)

    def _round(self, starts: Tensor) -> list[Emitted]:
        timed = self.stats.timed
        with timed("draft", self.device, self.stage_timing):
            draft_logits = self._draft(starts)  # [B, L, V] or None
        with timed("build", self.device, self.stage_timing):
            tree = self._tree(draft_logits)
        with timed("verify", self.device, self.stage_timing):
            post, features = self._verify(starts, tree)
        with timed("commit", self.device, self.stage_timing):
            return self._commit(starts, tree, post, features)

    def _read_len(self, rows: int) -> int:
        """Prefix slots this round's attentions read (a host int: no sync)."""
        return self.shapes.read_len(max(self.starts_h[:rows]), self.cache.capacity)

    def _draft(self, starts: Tensor) -> Tensor | None:
        if self.spec.method == "none":
            return None
        return self.proposer.propose(DraftInput(
            self.features, self.feature_positions, self.anchors, starts,
            self._read_len(len(starts)), self.spec.block_size, self.fused))

    def _tree(self, draft_logits: Tensor | None) -> Tree:
        spec, anchors = self.spec, self.anchors
        if spec.method == "none":
            return chain_tree(anchors, anchors[:, None][:, :0])
        if spec.method == "dflash":
            return chain_tree(anchors, draft_logits.argmax(-1))
        # Width above the budget cannot change the tree (a child ranked below `budget` has
        # `budget` better siblings), so cap it: the candidate set is budget x width per depth.
        width = min(spec.width or spec.budget, spec.budget)
        return build_tree(anchors, draft_logits.float().log_softmax(-1), spec.budget, width,
                          spec.max_depth, spec.spine)

    def _verify(self, starts: Tensor, tree: Tree) -> tuple[Tensor, Tensor]:
        """One target forward over every node of every row -> the target's token per node."""
        nodes = torch.arange(tree.num_nodes, device=self.device)
        step = Step(starts[:, None] + tree.depths, starts[:, None] + nodes, starts,
                    self._read_len(len(starts)), tree.mask, self.fused)
        hidden, features = self.target(tree.tokens, step, self.cache, self.taps)  # [B, N, *]
        samplings = [r.sampling if r else None for r in self.requests[: len(starts)]]
        return sample_rows(self.target.logits(hidden), samplings, self.generator), features

    def _commit(self, starts: Tensor, tree: Tree, post: Tensor, features: Tensor) -> list[Emitted]:
        acc = accept(tree, post, self.spec.max_depth + 1)
        self.cache.commit(starts, acc.path)
        self.features = features.gather(1, acc.path[..., None].expand(-1, -1, features.shape[-1]))
        offsets = torch.arange(acc.path.shape[1], device=self.device)
        self.feature_positions = starts[:, None] + offsets  # [B, A]
        accepted = tree.tokens.gather(1, acc.path)  # [B, A]
        host = torch.cat([acc.lengths[:, None], acc.bonus[:, None], accepted], 1).tolist()
        self.anchors = acc.bonus
        self.stats.rounds += 1
        events = []
        for b in self.live_rows():  # the round's one host sync is the .tolist() above
            length, bonus, path_tokens = host[b][0], host[b][1], host[b][2:]
            self.stats.acceptance[length] += 1
            self.starts_h[b] += length
            events.append(Emitted(b, *self._emit(b, path_tokens[1:length] + [bonus])))
        # Finished and free rows restart at slot 0 so their ignored work stays inside the cache.
        live = set(self.live_rows())
        self.starts_h = [s if b in live else 0 for b, s in enumerate(self.starts_h)]
        return events

    def _emit(self, b: int, tokens: list[int]) -> tuple[list[int], str | None]:
        """Append to request b up to its stop / limits; returns what was kept and the finish."""
        req = self.requests[b]
        kept = []
        for token in tokens:
            kept.append(token)
            req.output.append(token)
            req.finish = _finish_reason(req, token, self.max_context)
            if req.finish:
                break
        self.stats.generated_tokens += len(kept)
        return kept, req.finish

    def _tensor(self, values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)


def _finish_reason(req: Request, token: int, max_context: int) -> str | None:
    if token in req.sampling.stop_token_ids:
        return "stop"
    if len(req.output) >= req.sampling.max_tokens:
        return "max_tokens"
    if req.prompt_len + len(req.output) >= max_context:
        return "length"
    return None


def _pad_to(x: Tensor, width: int) -> Tensor:
    """[B, C, F] -> [B, width, F] with zero rows appended."""
    return torch.nn.functional.pad(x, (0, 0, 0, width - x.shape[1]))


def _extend_positions(positions: Tensor, width: int) -> Tensor:
    """[B, C] -> [B, width], continuing each row's run of positions past its last entry."""
    extra = positions[:, -1:] + torch.arange(1, width - positions.shape[1] + 1,
                                             device=positions.device)
    return torch.cat([positions, extra], dim=1)


def _pad_rows(x: Tensor, rows: int) -> Tensor:
    """[n, ...] -> [rows, ...] with zero rows appended."""
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])
