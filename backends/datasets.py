"""Prompt sets read from files: what a measurement sends when the user has real traffic.

Formats (chosen by content, not by name):
* JSONL, one object per line: ``{"prompt": "text" | [token ids], "output_tokens": N}``, with
  ``output_tokens`` optional. This is also ``vllm bench serve``'s custom-dataset format.
* ShareGPT JSON: a list of ``{"conversations": [{"from": "human", "value": ...},
  {"from": "gpt", "value": ...}, ...]}``; the first human turn is the prompt and the reply that
  follows it gives the output length (its token count), as ``vllm bench serve`` samples it.
* A JSON list of prompts: strings or lists of token ids (what a built pair keeps as
  ``heldout_prompts.json``).

Text goes through the target's tokenizer (``tokenizer.json`` in its folder) when there is one,
so every engine is sent the same token ids and lengths are counted in tokens; without one the
text is sent as it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.errors import UserError


class DatasetError(UserError):
    """A prompt file that cannot be read; the message names the file and the line or entry."""


@dataclass(slots=True, frozen=True)
class Sample:
    prompt: list[int] | str
    output_len: int | None = None  # what the dataset says the reply is; None: not said
    reply: str | None = None  # ShareGPT: the reply, whose token count is the output length


def load_samples(path: str | Path, tokenizer_dir: str | Path | None = None) -> list[Sample]:
    """Every usable sample of the file at ``path``, text tokenized when a tokenizer is found."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset {path} not found")
    text = path.read_text(encoding="utf-8")
    samples = _parse(path, text)
    if not samples:
        raise DatasetError(f"dataset {path} holds no prompts")
    tokenizer = _tokenizer(tokenizer_dir)
    return [Sample(_ids(tokenizer, s.prompt), s.output_len or _reply_len(tokenizer, s.reply))
            for s in samples]


def _parse(path: Path, text: str) -> list[Sample]:
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            entries = json.loads(text)
        except json.JSONDecodeError as error:
            raise DatasetError(f"dataset {path} is not valid JSON: {error}") from None
        return [_json_entry(path, i, e) for i, e in enumerate(entries) if not _skipped(e)]
    return [_jsonl_line(path, n, line) for n, line in enumerate(text.splitlines(), 1)
            if line.strip()]


def _skipped(entry: Any) -> bool:
    """ShareGPT dumps hold conversations without a human turn followed by a reply; the
    benchmark tools skip them, and so do we."""
    return isinstance(entry, dict) and "conversations" in entry and _sharegpt(entry) is None


def _jsonl_line(path: Path, number: int, line: str) -> Sample:
    where = f"dataset {path} line {number}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise DatasetError(f"{where} is not valid JSON: {error}") from None
    if not isinstance(row, dict) or "prompt" not in row:
        raise DatasetError(f"{where}: each line must be an object with a 'prompt'")
    return Sample(_prompt(where, row["prompt"]), _length(where, row.get("output_tokens")))


def _json_entry(path: Path, index: int, entry: Any) -> Sample:
    where = f"dataset {path} entry {index}"
    if isinstance(entry, dict) and "conversations" in entry:
        prompt, reply = _sharegpt(entry)
        return Sample(_prompt(where, prompt), reply=reply if isinstance(reply, str) else None)
    if isinstance(entry, dict) and "prompt" in entry:
        return Sample(_prompt(where, entry["prompt"]), _length(where, entry.get("output_tokens")))
    return Sample(_prompt(where, entry))


def _sharegpt(entry: dict) -> tuple[str, str | None] | None:
    turns = entry["conversations"]
    if not isinstance(turns, list):
        return None
    for i, turn in enumerate(turns[:-1]):
        if isinstance(turn, dict) and turn.get("from") == "human" and turn.get("value"):
            reply = turns[i + 1]
            return turn["value"], reply.get("value") if isinstance(reply, dict) else None
    return None


def _reply_len(tokenizer, reply: str | None) -> int | None:
    if not reply:
        return None
    # Without the target's tokenizer, words stand in for tokens (they undercount them).
    count = len(tokenizer.encode(reply).ids) if tokenizer else len(reply.split())
    return max(1, count)


def _prompt(where: str, value: Any) -> list[int] | str:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(_is_id(v) for v in value):
        return list(value)
    raise DatasetError(f"{where}: a prompt must be non-empty text or a list of token ids, "
                       f"got {str(value)[:60]!r}")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _length(where: str, value: Any) -> int | None:
    if value is None:
        return None
    if not _is_id(value) or value < 1:
        raise DatasetError(f"{where}: output_tokens must be an integer >= 1, got {value!r}")
    return value


def _tokenizer(folder: str | Path | None):
    if folder is None or not (Path(folder) / "tokenizer.json").is_file():
        return None
    from dflash_core.training.tokenizer import load_tokenizer

    return load_tokenizer(folder)


def _ids(tokenizer, prompt: list[int] | str) -> list[int] | str:
    if tokenizer is None or isinstance(prompt, list):
        return prompt
    return tokenizer.encode(prompt).ids
