"""The tiny pair in the layout real engines load: complete HF configs and tokenizer files in
both folders, added in place without touching a weight."""

from __future__ import annotations

import hashlib
import json
import shutil

from dflash_core.models.config import DrafterConfig, ModelConfig
from dflash_core.training import hf_layout
from dflash_core.training.pair import PARTS, ensure_pair

PAIR = ensure_pair()


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _strip_to_our_own_fields(pair) -> None:
    """The pair as builds before the HF fields wrote it."""
    for folder in ("target", "drafter"):
        path = pair / folder / "config.json"
        raw = json.loads(path.read_text())
        for key in ("max_position_embeddings", "torch_dtype", "hidden_act", "attention_bias",
                    "bos_token_id", "eos_token_id", "num_target_layers"):
            raw.pop(key, None)
        path.write_text(json.dumps(raw))
    for name in ("target/tokenizer_config.json", "drafter/tokenizer.json",
                 "drafter/tokenizer_config.json"):
        (pair / name).unlink(missing_ok=True)


def test_an_old_pair_is_completed_in_place_with_its_weights_untouched(tmp_path):
    pair = tmp_path / "pair"
    for part in PARTS:
        (pair / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PAIR / part, pair / part)
    _strip_to_our_own_fields(pair)
    weights = {p: _digest(pair / p) for p in PARTS if p.endswith(".safetensors")}

    assert ensure_pair(pair) == pair  # completes it; nothing is rebuilt
    assert {p: _digest(pair / p) for p in weights} == weights
    target = json.loads((pair / "target" / "config.json").read_text())
    drafter = json.loads((pair / "drafter" / "config.json").read_text())
    eos = json.loads((pair / "target" / "tokenizer.json").read_text())["added_tokens"][0]
    assert eos["content"] == "<|endoftext|>"
    for raw in (target, drafter):
        assert raw["max_position_embeddings"] == hf_layout.MAX_POSITIONS
        assert (raw["torch_dtype"], raw["hidden_act"]) == ("bfloat16", "silu")
        assert raw["eos_token_id"] == raw["bos_token_id"] == eos["id"]
    assert drafter["num_target_layers"] == target["num_hidden_layers"]
    assert _digest(pair / "drafter" / "tokenizer.json") == _digest(pair / "target" / "tokenizer.json")
    tokenizer_config = json.loads((pair / "drafter" / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tokenizer_config["eos_token"] == "<|endoftext|>"
    # Our own loaders read the completed files as before.
    assert ModelConfig.from_dict(target).num_hidden_layers == target["num_hidden_layers"]
    assert DrafterConfig.from_dict(drafter).target_layer_ids == [1, 3, 4]
    assert hf_layout.complete(pair) == []  # a second pass has nothing to add


def test_the_shipped_pair_is_already_complete():
    assert hf_layout.complete(PAIR) == []
