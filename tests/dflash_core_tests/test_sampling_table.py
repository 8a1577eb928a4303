"""The per-row sampling table draws each row exactly as the one-request reference
(`reference.filtered_logits` + `reference.sample`) would, in one pass over the batch and
without reading the device on the host."""

from __future__ import annotations

import pytest
import torch
from core_helpers import host_sync_ops
from reference import filtered_logits, sample

from dflash_core import SamplingParams
from dflash_core.speculation.sampling import SamplingTable, sample_table, table_filtered_logits

V = 12
ROWS = [  # greedy, pure temperature, top-k (k = 1, k = V, k > V), top-p (tiny, 1.0), both
    None,
    SamplingParams(),
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.5),
    SamplingParams(temperature=1.0, top_k=1),
    SamplingParams(temperature=1.3, top_k=3),
    SamplingParams(temperature=1.0, top_k=V),
    SamplingParams(temperature=0.8, top_k=V + 5),
    SamplingParams(temperature=1.0, top_p=1e-6),
    SamplingParams(temperature=2.0, top_p=0.5),
    SamplingParams(temperature=1.0, top_k=2, top_p=1.0),
    SamplingParams(temperature=0.7, top_k=4, top_p=0.9),
    SamplingParams(temperature=1.5, top_k=7, top_p=0.3),
]
def _logits(kind: str, n: int = 5, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if kind == "ties":  # few distinct values: ties at the k-th value and at the top-p edge
        return torch.randint(-2, 3, (len(ROWS), n, V), generator=gen).float()
    return torch.randn(len(ROWS), n, V, generator=gen) * 2


def _sampling(params: SamplingParams | None) -> bool:
    return params is not None and not params.greedy


@pytest.mark.parametrize("kind", ["continuous", "ties"])
def test_table_filters_each_row_like_filtered_logits(kind):
    logits = _logits(kind)
    got = table_filtered_logits(logits, SamplingTable.of(ROWS, "cpu"))
    for b, params in enumerate(ROWS):
        if not _sampling(params):
            continue
        want = filtered_logits(logits[b], params)
        assert torch.equal(torch.isfinite(got[b]), torch.isfinite(want)), (b, params)
        torch.testing.assert_close(got[b].softmax(-1), want.softmax(-1))


def test_top_p_edges_match_filtered_logits():
    """Mass exactly at top_p drops the token; top_p = 1.0 keeps a tail the cumsum rounds to 1."""
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0]], [[0.0, -30.0, -30.0, -40.0]]])  # [2, 1, 4]
    rows = [SamplingParams(temperature=1.0, top_p=0.5), SamplingParams(temperature=1.0, top_k=3)]
    got = torch.isfinite(table_filtered_logits(logits, SamplingTable.of(rows, "cpu")))
    want = [torch.isfinite(filtered_logits(logits[b], p)) for b, p in enumerate(rows)]
    assert torch.equal(got, torch.stack(want))
    assert got.sum(-1).flatten().tolist() == [2, 3]


@pytest.mark.parametrize("mode", ["sample", "filter"])
def test_greedy_rows_take_the_argmax_in_every_mode(mode):
    logits = _logits("continuous").to(torch.bfloat16)
    table = SamplingTable.of(ROWS, "cpu")
    tokens = sample_table(logits, table, torch.Generator().manual_seed(0), mode)
    assert torch.equal(tokens[table.greedy], logits.argmax(-1)[table.greedy])
    all_greedy = SamplingTable.allocate(len(ROWS), "cpu")
    assert torch.equal(sample_table(logits, all_greedy, None, "greedy"), logits.argmax(-1))


def test_each_row_races_once_over_its_own_distribution():
    """The exact tokens: one [B, N, V] noise draw, each row racing over its filtered probs."""
    logits, table = _logits("continuous"), SamplingTable.of(ROWS, "cpu")
    tokens = sample_table(logits, table, torch.Generator().manual_seed(3), "filter")
    noise = torch.empty(logits.shape).exponential_(generator=torch.Generator().manual_seed(3))
    for b, params in enumerate(ROWS):
        if _sampling(params):
            want = (filtered_logits(logits[b], params).softmax(-1) / noise[b]).argmax(-1)
        else:
            want = logits[b].argmax(-1)
        assert torch.equal(tokens[b], want), (b, params)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.9),
                                    SamplingParams(temperature=0.7, top_k=4, top_p=0.9)])
def test_a_uniform_table_draws_the_tokens_of_sample(params):
    logits = _logits("continuous")
    table = SamplingTable.of([params] * len(ROWS), "cpu")
    got = sample_table(logits, table, torch.Generator().manual_seed(4), table.mode())
    assert torch.equal(got, sample(logits, params, torch.Generator().manual_seed(4)))


@pytest.mark.parametrize("kind", ["continuous", "ties"])
def test_draws_never_leave_the_row_support(kind):
    logits = _logits(kind, n=1).expand(-1, 2000, -1)  # [B, 2000, V]: 2,000 draws per row
    table = SamplingTable.of(ROWS, "cpu")
    tokens = sample_table(logits, table, torch.Generator().manual_seed(5), "filter")
    kept = torch.isfinite(table_filtered_logits(logits, table)).gather(-1, tokens[..., None])
    assert kept.all()


def test_row_frequencies_match_their_own_distribution():
    draws = 4000
    logits = _logits("continuous", n=1, seed=6)  # [B, 1, V]
    table = SamplingTable.of(ROWS, "cpu")
    tokens = sample_table(logits.expand(-1, draws, -1), table, torch.Generator().manual_seed(6),
                          "filter")
    freq = torch.zeros(len(ROWS), V).scatter_add_(1, tokens, torch.ones(tokens.shape)) / draws
    want = table_filtered_logits(logits, table)[:, 0].softmax(-1)
    want[table.greedy] = torch.nn.functional.one_hot(logits[table.greedy, 0].argmax(-1), V).float()
    # One frequency's standard deviation is at most 0.008 here; a row drawn from another row's
    # distribution (or unfiltered) is off by more than 0.1 somewhere.
    assert (freq - want).abs().max() < 0.04


def test_mode_tracks_the_rows_on_the_host():
    table = SamplingTable.allocate(4, "cpu")
    pointers = [t.data_ptr() for t in (table.temperature, table.top_k, table.top_p, table.greedy)]
    assert table.mode() == "greedy"
    table.set_row(1, SamplingParams(temperature=0.8))
    assert table.mode() == "sample"
    table.set_row(3, SamplingParams(temperature=0.8, top_p=0.5))
    assert (table.mode(), table.mode(3), table.mode(1)) == ("filter", "sample", "greedy")
    view = table.rows(2)
    assert view.mode() == "sample" and view.top_k.data_ptr() == table.top_k.data_ptr()
    view.set_row(0, SamplingParams(temperature=1.0, top_k=5))  # a view writes through
    assert table.mode(2) == "filter" and table.top_k.tolist() == [5, 0, 0, 0]
    table.set_row(0, None)
    table.set_row(3, SamplingParams())
    assert table.mode() == "sample" and table.greedy.tolist() == [True, False, True, True]
    assert torch.equal(table.temperature, torch.tensor([1.0, 0.8, 1.0, 1.0]))
    table.set_row(2, SamplingParams(temperature=0.5, top_k=3))
    table.clear()  # a new batch: every row idle
    assert table.mode() == "greedy" and table.greedy.all() and table.top_k.sum() == 0
    assert torch.equal(table.temperature, torch.ones(4))
    after = [t.data_ptr() for t in (table.temperature, table.top_k, table.top_p, table.greedy)]
    assert after == pointers


def test_set_row_writes_tables_made_in_or_out_of_inference_mode():
    with torch.inference_mode():
        inference = SamplingTable.allocate(2, "cpu")
    normal = SamplingTable.allocate(2, "cpu")
    for table in (inference, normal):
        table.set_row(1, SamplingParams(temperature=0.5, top_k=3))
        with torch.inference_mode():
            table.set_row(0, SamplingParams(temperature=2.0))
        assert table.top_k.tolist() == [0, 3] and table.mode() == "filter"
    assert not normal.top_k.is_inference()


def test_the_op_recorder_sees_host_syncs():
    x = torch.randn(6)
    assert host_sync_ops(lambda: x.sum().item()) == {"aten._local_scalar_dense"}
    assert host_sync_ops(lambda: x.nonzero()) == {"aten.nonzero"}
    assert host_sync_ops(lambda: torch.tensor([1, 2])) == {"aten.lift_fresh"}
    assert host_sync_ops(lambda: x[x > 0]) == {"aten.index[bool]"}
    assert host_sync_ops(lambda: x[torch.arange(2)]) == set()  # integer gathers are fine


@pytest.mark.parametrize("mode", ["greedy", "sample", "filter"])
def test_sample_table_never_syncs(mode):
    logits, table = _logits("ties"), SamplingTable.of(ROWS, "cpu")
    generator = torch.Generator().manual_seed(0)
    assert host_sync_ops(lambda: sample_table(logits, table, generator, mode)) == set()
    # The recorder cannot see .tolist(); meta tensors hold no data, so any host read raises.
    meta = SamplingTable.allocate(len(ROWS), "meta")
    assert sample_table(logits.to("meta"), meta, None, mode).shape == logits.shape[:-1]
