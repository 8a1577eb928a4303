"""Target-side sampling, shared by plain and speculative decoding.

Sampling uses the exponential race (argmax of p / Exp(1) noise), which draws from p without a
host sync and treats every tree node independently, as the acceptance walk requires.

A batch mixes requests that sample differently, and a CUDA graph cannot group rows on the host,
so `SamplingTable` keeps every row's parameters in device tensors (written by `set_row` between
rounds) and `sample_table` applies them all at once; the host keeps only the facts that choose
which kernels run (`SamplingTable.mode`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dflash_core.speculation.spec import SamplingParams


@dataclass(slots=True)
class SamplingTable:
    """One row per batch slot. The tensors are read inside the round, so they are only written
    in place (set_row) and views keep their storage; the host lists mirror them so `mode` never
    reads the device. Views from `rows` share the host lists, which cover the whole allocation."""

    temperature: Tensor  # [R] float32; greedy rows hold 1.0 (unused)
    top_k: Tensor  # [R] long; 0 = no top-k
    top_p: Tensor  # [R] float32; 1.0 = no top-p
    greedy: Tensor  # [R] bool
    samples: list[bool]  # [R] host: temperature > 0
    filters: list[bool]  # [R] host: samples with top-k or top-p

    @classmethod
    def allocate(cls, rows: int, device: torch.device | str) -> SamplingTable:
        """Every row starts idle (greedy)."""
        return cls(torch.ones(rows, device=device),
                   torch.zeros(rows, dtype=torch.long, device=device),
                   torch.ones(rows, device=device),
                   torch.ones(rows, dtype=torch.bool, device=device),
                   [False] * rows, [False] * rows)

    @classmethod
    def of(cls, samplings: list[SamplingParams | None], device: torch.device | str) -> SamplingTable:
        """A fresh table for callers outside a graph: filled on the host, one copy per field."""
        table = cls.allocate(len(samplings), "cpu")
        for row, params in enumerate(samplings):
            table.set_row(row, params)
        return cls(table.temperature.to(device), table.top_k.to(device), table.top_p.to(device),
                   table.greedy.to(device), table.samples, table.filters)

    def set_row(self, row: int, params: SamplingParams | None) -> None:
        """None = an idle row, sampled greedily. Writes in place; call it outside the round."""
        samples = params is not None and not params.greedy
        # Tables outlive a generate call, so one allocated under inference_mode may be written
        # outside it; inside it, in-place writes suit inference and normal tensors alike.
        with torch.inference_mode():
            self.temperature[row] = params.temperature if samples else 1.0
            self.top_k[row] = params.top_k if samples else 0
            self.top_p[row] = params.top_p if samples else 1.0
            self.greedy[row] = not samples
        self.samples[row] = samples
        self.filters[row] = samples and (params.top_k > 0 or params.top_p < 1.0)

    def clear(self) -> None:
        """Every row idle (greedy), in place."""
        with torch.inference_mode():
            for tensor, value in ((self.temperature, 1.0), (self.top_k, 0), (self.top_p, 1.0),
                                  (self.greedy, True)):
                tensor.fill_(value)
        self.samples[:] = [False] * len(self.samples)
        self.filters[:] = [False] * len(self.filters)

    def rows(self, n: int) -> SamplingTable:
        """The first n rows, as views (a graph captured on them sees later set_row writes)."""
        return SamplingTable(self.temperature[:n], self.top_k[:n], self.top_p[:n],
                             self.greedy[:n], self.samples, self.filters)

    def mode(self, n: int | None = None) -> str:
        """The cheapest kernel set that serves rows [:n] (default: all of this table's rows)."""
        n = len(self.greedy) if n is None else n
        if any(self.filters[:n]):
            return "filter"
        return "sample" if any(self.samples[:n]) else "greedy"


def sample_table(logits: Tensor, table: SamplingTable, generator: torch.Generator | None,
                 mode: str) -> Tensor:
    """logits: [B, N, V], table rows [B] -> token ids [B, N], without a host sync.

    `mode` comes from `table.mode(B)`: a richer mode than needed is only slower, a poorer one
    ignores the rows' top-k / top-p (or samples them greedily). Noise is one draw of [B, N, V]."""
    return _KERNELS[mode](logits, table, generator)


def table_filtered_logits(logits: Tensor, table: SamplingTable) -> Tensor:
    """Per row: temperature, then top-k, then top-p: [B, N, V] -> temperature-scaled fp32
    logits, -inf where removed. One sort serves both filters (top-k removes a tail of the sorted
    order)."""
    scaled = logits.float() / table.temperature[:, None, None]  # [B, N, V]
    ordered, order = scaled.sort(dim=-1, descending=True, stable=True)  # [B, N, V]
    vocab = scaled.shape[-1]
    # Index of the k-th largest; top_k 0 or >= V points at the smallest, which keeps everything.
    k = table.top_k.masked_fill(table.top_k == 0, vocab).clamp(max=vocab) - 1  # [B]
    kth = ordered.gather(-1, k[:, None, None].expand(-1, ordered.shape[1], 1))  # [B, N, 1]
    cut = ordered < kth  # ties with the k-th value stay
    probs = ordered.masked_fill(cut, float("-inf")).softmax(-1)  # [B, N, V] sorted order
    mass_before = probs.cumsum(-1) - probs
    top_p = table.top_p[:, None, None]  # [B, 1, 1]
    # top_p = 1.0 is off, not a threshold: the cumsum of the tail may round up to 1.
    cut |= (mass_before >= top_p) & (top_p < 1.0)
    drop = torch.empty_like(cut).scatter_(-1, order, cut)  # back to vocab order
    return scaled.masked_fill(drop, float("-inf"))


def _greedy(logits: Tensor, table: SamplingTable, generator: torch.Generator | None) -> Tensor:
    return logits.argmax(-1)


def _sample(logits: Tensor, table: SamplingTable, generator: torch.Generator | None) -> Tensor:
    scaled = logits.float() / table.temperature[:, None, None]  # [B, N, V]
    return _race(logits, scaled, table, generator)


def _filter(logits: Tensor, table: SamplingTable, generator: torch.Generator | None) -> Tensor:
    return _race(logits, table_filtered_logits(logits, table), table, generator)


def _race(logits: Tensor, scaled: Tensor, table: SamplingTable,
          generator: torch.Generator | None) -> Tensor:
    """Exponential race over softmax(scaled) [B, N, V]; greedy rows take argmax of the raw logits."""
    probs = scaled.softmax(-1)
    noise = torch.empty_like(probs).exponential_(generator=generator)
    drawn = (probs / noise).argmax(-1)  # [B, N]
    return torch.where(table.greedy[:, None], logits.argmax(-1), drawn)


_KERNELS = {"greedy": _greedy, "sample": _sample, "filter": _filter}

