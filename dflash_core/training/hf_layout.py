"""The Hugging Face fields and files other engines need beyond what ours reads.

Our loader needs only the shapes. vLLM, SGLang and transformers also read the context length, the
weights' dtype, the activation, the special token ids and a tokenizer in *each* model folder
(vLLM loads the drafter as a model of its own, with its own tokenizer). `complete` adds what is
missing to a built pair in place; weights are never touched, so an old pair stays bit-identical.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from dflash_core.training.tokenizer import END_OF_TEXT

# The tiny pair is trained on 128-token windows, but RoPE runs past that; 4096 lets real engines
# take the prompt + output lengths a benchmark asks for, and sizes a KV cache of a few MiB.
MAX_POSITIONS = 4096
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def complete(pair: str | Path) -> list[str]:
    """Add the missing HF fields and tokenizer files to `pair`'s two folders; the paths written."""
    pair = Path(pair)
    target, drafter = pair / "target", pair / "drafter"
    eos = _token_id(target / "tokenizer.json", END_OF_TEXT)
    written = _write_tokenizer_config(target, eos is not None)
    target_layers = _read(target / "config.json")["num_hidden_layers"]
    written += _patch(target / "config.json", _model_fields(eos))
    written += _patch(drafter / "config.json",
                      {**_model_fields(eos), "num_target_layers": target_layers})
    for name in TOKENIZER_FILES:
        if not (drafter / name).is_file():
            shutil.copyfile(target / name, drafter / name)
            written.append(str(drafter / name))
    return written


def _model_fields(eos: int | None) -> dict[str, Any]:
    fields: dict[str, Any] = {"max_position_embeddings": MAX_POSITIONS,
                              "torch_dtype": "bfloat16", "hidden_act": "silu",
                              "attention_bias": False}
    if eos is not None:
        fields |= {"bos_token_id": eos, "eos_token_id": eos}
    return fields


def _patch(path: Path, fields: dict[str, Any]) -> list[str]:
    raw = _read(path)
    missing = {k: v for k, v in fields.items() if k not in raw}
    if not missing:
        return []
    path.write_text(json.dumps(raw | missing, indent=2))
    return [str(path)]


def _write_tokenizer_config(folder: Path, has_eos: bool) -> list[str]:
    path = folder / "tokenizer_config.json"
    if path.is_file():
        return []
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                              "model_max_length": MAX_POSITIONS, "clean_up_tokenization_spaces": False}
    if has_eos:
        config |= {"eos_token": END_OF_TEXT, "bos_token": END_OF_TEXT}
    path.write_text(json.dumps(config, indent=2))
    return [str(path)]


def _token_id(tokenizer_json: Path, token: str) -> int | None:
    added = _read(tokenizer_json).get("added_tokens", [])
    return next((t["id"] for t in added if t.get("content") == token), None)


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
