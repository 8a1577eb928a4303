"""Log-probabilities of the tokens a request was given, for clients that ask for `logprobs`.

The engine's rounds keep no per-token distributions (a verify's [n, N, V] logits are sampled and
dropped inside the round, possibly inside a CUDA graph), so a request that asks is scored
beside them: the target alone re-reads the prompt and each emitted token, causally, into a
scratch cache of its own (`LiveBatch.feed_scratch`), on the engine thread between rounds.
Requests that do not ask pay nothing. The distribution is the one the token was sampled from:
the target's softmax after temperature for T > 0, the raw softmax for greedy; top-k / top-p
filtering is not applied (vLLM's default "raw" logprobs do the same up to the temperature).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

MAX_TOP_LOGPROBS = 20  # vLLM's default max_logprobs
# JSON has no -Infinity; vLLM reports a zero-probability token at this floor as well.
LOGPROB_FLOOR = -9999.0


@dataclass(slots=True)
class TokenLogprobs:
    token: int
    logprob: float
    top: list[tuple[int, float]]  # the `top_n` most likely (id, logprob), best first


class Scorer:
    """One request's teacher-forced scoring: `score` takes the tokens just emitted and returns
    their log-probabilities, feeding them into the batch's scratch sequence `key` (the target's
    forwards; over several ranks every rank runs them, and every rank has the gathered logits)
    for the next call."""

    def __init__(self, batch, key: int, prompt: list[int], temperature: float,
                 top_n: int) -> None:
        self.batch, self.key, self.temperature, self.top_n = batch, key, temperature, top_n
        self.pending = self._feed(prompt)[-1]  # [V]: predicts the first emitted token

    def score(self, tokens: list[int], final: bool) -> list[TokenLogprobs]:
        """`final`: nothing follows these tokens, so the last one need not be fed."""
        if not tokens:
            return []
        fed = tokens[:-1] if final else tokens
        logits = torch.cat([self.pending[None], self._feed(fed)]) if fed else self.pending[None]
        self.pending = logits[-1]
        return self._entries(logits[: len(tokens)], tokens)

    def close(self) -> None:
        """Free the scratch sequence (on every rank)."""
        self.batch.drop_scratch(self.key)

    def _feed(self, ids: list[int]) -> Tensor:
        return self.batch.feed_scratch(self.key, ids)  # [len(ids), V] fp32

    def _entries(self, logits: Tensor, tokens: list[int]) -> list[TokenLogprobs]:
        scaled = logits / self.temperature if self.temperature > 0 else logits  # [n, V]
        logprobs = scaled.log_softmax(-1).clamp_min(LOGPROB_FLOOR)
        chosen = logprobs.gather(1, torch.tensor(tokens, device=logits.device)[:, None])[:, 0]
        top = logprobs.topk(min(self.top_n, logprobs.shape[-1]), dim=-1)
        return [TokenLogprobs(t, lp, list(zip(ids, values)))
                for t, lp, ids, values in zip(tokens, chosen.tolist(), top.indices.tolist(),
                                              top.values.tolist())]
