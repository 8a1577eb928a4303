"""Prompt files (JSONL / vllm bench custom, ShareGPT, plain lists) and which prompts a
measurement sends, tokenized with the shipped pair's real tokenizer."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from backends.contract import Workload
from backends.datasets import DatasetError, load_samples
from backends.prompts import RANDOM_SOURCE, prompt_set, prompt_source
from dflash_core.training.pair import ensure_pair

PAIR = ensure_pair()
TARGET = PAIR / "target"
TOKENIZER = Tokenizer.from_file(str(TARGET / "tokenizer.json"))


def _ids(text: str) -> list[int]:
    return TOKENIZER.encode(text).ids


def test_jsonl_text_goes_through_the_targets_tokenizer_and_keeps_output_tokens(tmp_path):
    path = tmp_path / "custom.jsonl"
    rows = [{"prompt": "def add(a, b):", "output_tokens": 12}, {"prompt": [5, 6, 7]},
            {"prompt": "import os", "output_tokens": 3, "extra": "ignored"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    samples = load_samples(path, TARGET)
    assert [s.prompt for s in samples] == [_ids("def add(a, b):"), [5, 6, 7], _ids("import os")]
    assert [s.output_len for s in samples] == [12, None, 3]
    # Without a tokenizer the text is sent as it is.
    assert load_samples(path, tmp_path)[0].prompt == "def add(a, b):"


def test_sharegpt_takes_the_first_human_turn_and_counts_its_reply_in_tokens(tmp_path):
    reply = "return a + b  # the sum"
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([
        {"id": "1", "conversations": [{"from": "system", "value": "be brief"},
                                      {"from": "human", "value": "add two numbers"},
                                      {"from": "gpt", "value": reply}]},
        {"id": "2", "conversations": [{"from": "gpt", "value": "no question"}]},  # skipped
        {"id": "3", "conversations": [{"from": "human", "value": "last turn, no reply"}]},
    ]))
    [sample] = load_samples(path, TARGET)
    assert sample.prompt == _ids("add two numbers")
    assert sample.output_len == len(_ids(reply)) > 1


def test_a_json_list_of_prompts_is_read_like_heldout_prompts(tmp_path):
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps([[1, 2, 3], "x = 1"]))
    assert [s.prompt for s in load_samples(path, TARGET)] == [[1, 2, 3], _ids("x = 1")]


@pytest.mark.parametrize(("content", "message"), [
    ('{"prompt": "a"}\n{"text": "b"}\n', "line 2: each line must be an object with a 'prompt'"),
    ('{"prompt": "a"}\nnot json\n', "line 2 is not valid JSON"),
    ('{"prompt": ""}\n', "line 1: a prompt must be non-empty text or a list of token ids"),
    ('{"prompt": [1, -2]}\n', "a prompt must be non-empty text or a list of token ids"),
    ('{"prompt": "a", "output_tokens": 0}\n', "output_tokens must be an integer >= 1"),
    ("[1, 2", "is not valid JSON"),
    ("[]", "holds no prompts"),
])
def test_a_bad_prompt_file_names_the_file_and_the_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DatasetError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        load_samples(path, TARGET)
    assert str(path) in str(err.value)


def test_a_missing_dataset_is_one_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="not found"):
        load_samples(tmp_path / "nope.jsonl")


def test_a_measurement_prefers_the_dataset_then_held_out_prompts_then_random_ids(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "while True:", "output_tokens": 5}) + "\n")
    workload = Workload(input_len=16, output_len=9, concurrency=(1,), dataset=str(path))
    from_file = prompt_set(workload, TARGET, 4)
    assert from_file.prompts == [_ids("while True:")] and from_file.output_lens is None
    lens = prompt_set(Workload(16, 9, (1,), dataset=str(path), dataset_output_lens=True),
                      TARGET, 4)
    assert lens.output_lens == [5]
    held_out = prompt_set(Workload(16, 9, (1,)), TARGET, 4)
    assert held_out.source.startswith("held-out prompts") and len(held_out.prompts[0]) == 16
    elsewhere = tmp_path / "model"  # a target without held-out prompts beside it
    fallback = prompt_set(Workload(16, 9, (1,)), elsewhere, 4)
    assert fallback.source == RANDOM_SOURCE == prompt_source(Workload(16, 9, (1,)), elsewhere)
    assert len(fallback.prompts) == 4 and all(len(p) == 16 for p in fallback.prompts)
