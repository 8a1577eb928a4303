"""Bad input is refused at the public entry points with a ValueError that says what is wrong,
before any tensor work: a refused admission leaves the live batch as it was."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from core_helpers import BLOCK, VOCAB, dflash_engine, drafter_config, make_target

from dflash_core import CheckpointError, DFlashProposer, Drafter, SamplingParams, Spec

GREEDY = SamplingParams(max_tokens=4)


@pytest.fixture(scope="module")
def engine():
    return dflash_engine(batch=4)  # max_context 160


@pytest.mark.parametrize("field, value, message", [
    ("temperature", math.nan, "temperature must be finite and >= 0, got nan"),
    ("temperature", math.inf, "temperature must be finite and >= 0, got inf"),
    ("temperature", -0.5, "temperature must be finite and >= 0"),
    ("top_p", math.nan, r"top_p must be in \(0, 1\], got nan"),
    ("top_p", 0.0, r"top_p must be in \(0, 1\]"),
    ("top_k", -1, "top_k must be >= 0"),
    ("max_tokens", 0, "max_tokens must be >= 1"),
])
def test_sampling_params_refuse_nan_inf_and_out_of_range_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("prompts, message", [
    ([[1, 3.0]], r"prompt 0: token ids must be integers, got 3\.0"),
    ([[1], [2, 3.7]], r"prompt 1: token ids must be integers, got 3\.7"),
    ([[True, 2]], "prompt 0: token ids must be integers, got True"),
    ([[np.float32(2)]], "token ids must be integers"),
    ([[torch.tensor(2.0)]], "token ids must be integers"),
    ([[1, VOCAB]], rf"prompt 0: token ids must be in 0\.\.{VOCAB - 1}, got {VOCAB}"),
    ([[4], [-1]], r"prompt 1: token ids must be in 0\.\.\d+, got -1"),
    ([[]], r"prompt 0 has 0 tokens; every prompt needs 1\.\.159"),
    ([[1] * 160], r"prompt 0 has 160 tokens; every prompt needs 1\.\.159 \(max_context 160\)"),
    ([1, 2, 3], "prompt 0 must be a list of token ids, got int"),
    ("1 2 3", "prompts must be a list of token-id lists, got str"),
    ([], r"need 1\.\.4 prompts, got 0"),
    ([[1]] * 5, r"need 1\.\.4 prompts, got 5"),
])
def test_generate_refuses_bad_prompts_with_the_reason(engine, prompts, message):
    with pytest.raises(ValueError, match=message):
        engine.generate(prompts, GREEDY, Spec.dflash(BLOCK))


def test_integer_scalars_and_tuples_are_token_ids(engine):
    plain = engine.generate([[1, 2, 3]], GREEDY)
    same = engine.generate([(np.int64(1), torch.tensor(2), np.int32(3))], GREEDY)
    assert same.tokens == plain.tokens


def test_generate_refuses_a_sampling_that_is_not_sampling_params(engine):
    with pytest.raises(ValueError, match="sampling must be a SamplingParams, got dict"):
        engine.generate([[1, 2]], {"temperature": 0.0})


@pytest.mark.parametrize("prompts, samplings, message", [
    # Unchecked, the first failed inside torch.nn.functional.embedding, the second with a shape
    # error in the cache copy, the third dropped a request silently.
    ([[1, VOCAB + 5]], [GREEDY], rf"token ids must be in 0\.\.{VOCAB - 1}, got {VOCAB + 5}"),
    ([[1] * 200], [GREEDY], "prompt 0 has 200 tokens"),
    ([[1], [2]], [GREEDY], "2 prompts but 1 SamplingParams"),
    ([[1]], [GREEDY, GREEDY], "1 prompts but 2 SamplingParams"),
    ([[1]], [None], "samplings must be SamplingParams, got a NoneType"),
    ([[1, 2.5]], [GREEDY], "token ids must be integers, got 2.5"),
    ([[1]] * 3, [GREEDY] * 3, "3 requests but only 2 free rows"),
])
def test_admit_refuses_a_bad_request_and_leaves_the_batch_as_it_was(engine, prompts, samplings,
                                                                     message):
    batch = engine.open_batch(Spec.dflash(BLOCK), rows=4)
    batch.admit([[5, 6], [7]], [GREEDY, GREEDY])
    with pytest.raises(ValueError, match=message):
        batch.admit(prompts, samplings)
    assert batch.live_rows() == [0, 1] and batch.free_rows() == [2, 3]
    assert [e.row for e in batch.admit([[3, 4]], [GREEDY])] == [2]  # still serves


@pytest.mark.parametrize("kwargs, message", [
    (dict(rows=5), r"a batch needs 1\.\.4 rows \(max_batch\), got 5"),
    (dict(rows=0), r"a batch needs 1\.\.4 rows \(max_batch\), got 0"),
    (dict(spec="dflash"), "spec must be a Spec, got str"),
    (dict(spec=Spec.dflash(BLOCK + 1)), "trained block"),
])
def test_open_batch_refuses_bad_arguments(engine, kwargs, message):
    args = dict(spec=Spec.dflash(BLOCK)) | kwargs
    with pytest.raises(ValueError, match=message):
        engine.open_batch(**args)


def test_a_drafter_with_another_vocabulary_is_refused_by_its_proposer():
    drafter = Drafter(drafter_config(vocab_size=VOCAB + 2))
    with pytest.raises(CheckpointError, match=rf"drafter vocab_size {VOCAB + 2} != target "
                                              rf"vocab_size {VOCAB}"):
        DFlashProposer(drafter, make_target())
