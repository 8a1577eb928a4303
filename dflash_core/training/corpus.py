"""Text every machine has: the Python standard library's own source files.

Deterministic per Python version. Test suites are left out (huge, repetitive), and files are
split into train and held-out by a hash of their relative path, so the split does not depend
on the file system's order.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SKIP_PARTS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "lib2to3"}


@dataclass(slots=True)
class Corpus:
    train: list[str]  # file texts
    held_out: list[str]

    @property
    def train_chars(self) -> int:
        return sum(map(len, self.train))


def stdlib_files(root: Path | None = None) -> list[Path]:
    root = root or Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not SKIP_PARTS & set(p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def load_corpus(max_chars: int, held_out_every: int = 20, root: Path | None = None) -> Corpus:
    """Files in path order, 1 in `held_out_every` held out, until there are `max_chars` of
    training text and a proportional amount of held-out text."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    train, held_out = [], []
    for path in stdlib_files(root):
        text = path.read_text(encoding="utf-8", errors="replace")
        digest = hashlib.sha256(path.relative_to(root).as_posix().encode()).digest()
        (held_out if digest[0] % held_out_every == 0 else train).append(text)
        if sum(map(len, train)) >= max_chars and \
                sum(map(len, held_out)) >= max_chars // held_out_every:
            break
    return Corpus(train, held_out)
