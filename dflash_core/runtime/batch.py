"""A live batch: requests join free rows at any round and leave when done (continuous batching).

Each row of the engine's static cache holds at most one request. `admit` prefills new requests
into free rows; `step` runs one round (draft -> build -> verify -> accept -> commit) for every
row and returns what each live request emitted. `Engine.generate` is admit-all-then-step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dflash_core.models.cache import NodeWrites
from dflash_core.models.step import Step
from dflash_core.runtime.round import Round
from dflash_core.runtime.scratch import ScratchSequence
from dflash_core.runtime.shapes import RoundShapes
from dflash_core.runtime.stats import GenerationStats
from dflash_core.speculation.sampling import SamplingTable, sample_table
from dflash_core.speculation.spec import SamplingParams, checked_prompts


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
    def __init__(self, round_: Round, max_context: int, seed: int = 0,
                 shapes: RoundShapes = RoundShapes(), stage_timing: bool = False) -> None:
        self.round, self.state = round_, round_.state
        self.target, self.proposer, self.cache = round_.target, round_.proposer, round_.cache
        self.taps, self.fused, self.device = round_.taps, round_.fused, round_.device
        self.max_context, self.shapes, self.stage_timing = max_context, shapes, stage_timing
        rows = self.cache.rows
        self.requests: list[Request | None] = [None] * rows
        self.starts_h = [0] * rows  # committed length = position of the anchor, per row
        self.stats = GenerationStats()
        self.scratch: dict[int, ScratchSequence] = {}  # key -> a sequence scored beside
        self.generator = round_.generator
        round_.reset(seed, self.stats)
        if self.proposer is not None:
            self.proposer.begin(rows, self.cache.capacity)

    # --- rows -------------------------------------------------------------------------------

    def live_rows(self) -> list[int]:
        return [b for b, r in enumerate(self.requests) if r is not None and r.finish is None]

    def free_rows(self) -> list[int]:
        return [b for b, r in enumerate(self.requests) if r is None or r.finish is not None]

    def release(self, row: int) -> None:
        """Forget a finished (or abandoned) request so its row can be reused."""
        self.requests[row] = None
        self.starts_h[row] = 0
        self.state.sampling.set_row(row, None)

    # --- scratch sequences (scoring beside the rounds) ---------------------------------------

    def feed_scratch(self, key: int, ids: list[int]) -> Tensor:
        """Append ids to scratch sequence `key` (opened on first use, up to max_context tokens)
        -> the target's logits after each of them [len(ids), V]."""
        if key not in self.scratch:
            self.scratch[key] = ScratchSequence(self.target, self.max_context, self.fused)
        return self.scratch[key].feed(ids)

    def drop_scratch(self, key: int) -> None:
        self.scratch.pop(key, None)

    # --- admission ----------------------------------------------------------------------------

    def admit(self, prompts: list[list[int]], samplings: list[SamplingParams]) -> list[Emitted]:
        """Prefill new requests into free rows; returns their first token (sampled from the
        prefill logits) keyed by row. Refuses a bad request (ValueError) before any tensor work,
        so a refused admission leaves the batch as it was."""
        prompts = self._checked(prompts, samplings)
        if not prompts:
            return []
        rows = self.free_rows()[: len(prompts)]
        for b, sampling in zip(rows, samplings):
            self.state.sampling.set_row(b, sampling)
        with self.stats.timed("prefill", self.device, self.stage_timing):
            first = self._prefill(rows, prompts, samplings)
        events = []
        for b, prompt, sampling, token in zip(rows, prompts, samplings, first):
            self.requests[b] = Request(len(prompt), sampling, [])
            self.starts_h[b] = len(prompt)
            events.append(Emitted(b, *self._emit(b, [token])))
        return events

    def _checked(self, prompts: list[list[int]],
                 samplings: list[SamplingParams]) -> list[list[int]]:
        prompts = checked_prompts(prompts, self.target.config.vocab_size, self.max_context)
        if len(samplings) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(samplings)} SamplingParams")
        wrong = [type(s).__name__ for s in samplings if not isinstance(s, SamplingParams)]
        if wrong:
            raise ValueError(f"samplings must be SamplingParams, got a {wrong[0]}")
        free = len(self.free_rows())
        if len(prompts) > free:
            raise ValueError(f"{len(prompts)} requests but only {free} free rows")
        return prompts

    def _prefill(self, rows: list[int], prompts: list[list[int]],
                 samplings: list[SamplingParams]) -> list[int]:
        """The prompts' forward(s) -> their first tokens. With prompt buckets (a compiled
        forward) one request at a time in its bucket's graph; else all in one forward."""
        if not self.shapes.prompt_buckets:
            return self._forward_prompts(rows, prompts, samplings, max(map(len, prompts)))
        capacity = self.cache.capacity
        return [self._forward_prompts([b], [p], [s], self.shapes.prompt_len(len(p), capacity))[0]
                for b, p, s in zip(rows, prompts, samplings)]

    def _forward_prompts(self, rows: list[int], prompts: list[list[int]],
                         samplings: list[SamplingParams], padded: int) -> list[int]:
        """One causal forward over the prompts right-padded to `padded` tokens, its K/V held
        (it reads no prefix) and put into the rows; padding never reaches a real token and lands
        past each prefix. The prompt's drafter context is written now, so every round's pending
        context has one width."""
        lens, n = [len(p) for p in prompts], len(prompts)
        ids = self._tensor([p + [0] * (padded - len(p)) for p in prompts])  # [n, P]
        zeros = torch.zeros(n, dtype=torch.long, device=self.device)
        step = Step.causal(zeros, padded, 0, self.fused)
        nodes = NodeWrites(self.cache.row_range(n))
        hidden, features = self.round.forward(ids, step, nodes, self.taps)  # [n, P, *]
        index = self._tensor(rows)
        self.cache.put_rows(index, nodes.nodes())
        last = hidden[torch.arange(n, device=self.device), self._tensor(lens) - 1]  # [n, H]
        table = SamplingTable.of(samplings, self.device)
        first = sample_table(self.target.logits(last)[:, None], table, self.generator,
                             table.mode())[:, 0]
        if self.proposer is not None:
            self.proposer.absorb(rows, features, torch.arange(padded, device=self.device))
        state = self.state
        state.anchors[index] = first
        state.features[index] = 0  # nothing pending: slots past the prefix, never read
        offsets = torch.arange(self.round.path_len, device=self.device)
        state.feature_positions[index] = self._tensor(lens)[:, None] + offsets
        return first.tolist()

    # --- one round ----------------------------------------------------------------------------

    def step(self) -> list[Emitted]:
        """One round over rows 0..n-1, n = the last live row + 1 rounded up to a batch bucket:
        a server at low load does not pay for its idle rows (rows are handed out lowest
        first)."""
        live = self.live_rows()
        if not live:
            return []
        n = self.shapes.rows(max(live) + 1, len(self.requests))
        read_len = self.shapes.read_len(max(self.starts_h[:n]), self.cache.capacity)
        mode = self.state.sampling.mode(n)
        self.state.starts[:n].copy_(self._tensor(self.starts_h[:n]))
        self.round.step(n, read_len, mode, self.stage_timing)
        return self._emit_round(n)

    def capture(self, read_lens: list[int] | None = None,
                modes: tuple[str, ...] = ("greedy",)) -> int:
        """Capture the CUDA graphs, or compile the compiled forwards (their CPU analogue), of
        every row count (largest first) x read length (x sampling mode, for graphs: a compiled
        forward does not depend on it) before any request arrives, so no request waits for a
        capture or a compile; compiled, also every prompt bucket's prefill. Each shape runs one
        real round over idle rows (harmless: they compute into their own rows). Default read
        lengths: every bucket up to the engine's max_context. Returns how many graphs were
        made."""
        graphs, compiled = self.round.graphs, self.round.compiled()
        if graphs is None and not compiled:
            raise ValueError("neither CUDA graphs nor compile is on (EngineConfig.cuda_graphs, "
                             "EngineConfig.compile)")
        if self.live_rows():
            raise RuntimeError("capture runs rounds on idle rows: call it before admitting")

        def made() -> int:
            return graphs.captures if graphs else sum(c.compiles for c in compiled)

        before = made()
        if self.shapes.prompt_buckets:  # a one-token prompt into row 0, redone at its admission
            for padded in self.shapes.all_prompt_lens(self.max_context, self.cache.capacity):
                self._forward_prompts([0], [[0]], [SamplingParams()], padded)
        lens = read_lens or self.shapes.all_read_lens(self.max_context, self.cache.capacity)
        self.state.starts.zero_()
        for n in self.shapes.all_rows(len(self.requests)):
            for read_len in lens:
                for mode in modes if graphs else modes[:1]:
                    if graphs is None or (n, read_len, mode) not in graphs.graphs:
                        self.round.step(n, read_len, mode, False)
        return made() - before

    def _emit_round(self, n: int) -> list[Emitted]:
        host = self.state.packet[:n].tolist()  # the round's one host sync
        self.stats.rounds += 1
        events = []
        for b in self.live_rows():
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
                self.state.sampling.set_row(b, None)  # its row idles: greedy is cheapest
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
