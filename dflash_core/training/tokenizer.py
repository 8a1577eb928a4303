"""A byte-level BPE tokenizer trained on the corpus (the `tokenizers` package)."""

from __future__ import annotations

from pathlib import Path

from dflash_core.models.errors import CheckpointError

END_OF_TEXT = "<|endoftext|>"
MASK = "<|mask|>"


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT, MASK],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def load_tokenizer(directory: str | Path):
    """The checkpoint's ``tokenizer.json``; a CheckpointError naming it when `tokenizers`
    cannot read it."""
    from tokenizers import Tokenizer

    path = Path(directory) / "tokenizer.json"
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception for a file it cannot parse
        reason = (str(error).splitlines() or [type(error).__name__])[0]
        raise CheckpointError(f"{path} is not a tokenizer the `tokenizers` package reads "
                              f"({reason})") from None


def encode_files(tokenizer, texts: list[str]) -> list[int]:
    """All files as one stream, separated by the end-of-text token."""
    eot = tokenizer.token_to_id(END_OF_TEXT)
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts):
        ids += encoding.ids + [eot]
    return ids
