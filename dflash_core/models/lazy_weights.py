"""A checkpoint's tensors by name, read from their safetensors shard only when copied.

Opening reads the headers (names, shapes) only, so the loader checks a checkpoint against the
model before any data moves, then copies shard by shard, one tensor at a time, into the model's
own (already allocated) parameters: a checkpoint never exists twice in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from dflash_core.models.errors import CheckpointError

_UNREADABLE = (SafetensorError, OSError, ValueError, RuntimeError)


class LazyWeights(Mapping[str, torch.Tensor]):
    def __init__(self, where: dict[str, tuple[Path, str]],
                 shapes: dict[str, tuple[int, ...]]) -> None:
        self._where, self._shapes = where, shapes  # name -> (shard, its key there), shape

    @classmethod
    def open(cls, files: list[Path]) -> LazyWeights:
        where, shapes = {}, {}
        for path in files:
            with _opened(path) as shard:
                for key in shard.keys():
                    where[key] = (path, key)
                    shapes[key] = tuple(shard.get_slice(key).get_shape())
        return cls(where, shapes)

    def renamed(self, names: dict[str, str]) -> LazyWeights:
        """Only the tensors in `names` (new name -> stored name), under their new names."""
        return LazyWeights({new: self._where[old] for new, old in names.items()},
                           {new: self._shapes[old] for new, old in names.items()})

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def each(self, names: set[str], use: Callable[[str, torch.Tensor], None]) -> None:
        """use(name, tensor) for `names`, each shard opened once; a tensor is read only after
        the previous one's `use` returned, and nothing here keeps it."""
        by_shard: dict[Path, list[str]] = {}
        for name in sorted(names):
            by_shard.setdefault(self._where[name][0], []).append(name)
        for path, shard_names in by_shard.items():
            with _opened(path) as shard:
                for name in shard_names:
                    use(name, _read(shard, path, self._where[name][1]))

    def __getitem__(self, name: str) -> torch.Tensor:
        path, key = self._where[name]
        with _opened(path) as shard:
            return _read(shard, path, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def _opened(path: Path):
    try:
        return safe_open(str(path), framework="pt")
    except _UNREADABLE as error:
        raise CheckpointError(f"{path} is not a readable safetensors file: {error}") from None


def _read(shard, path: Path, key: str) -> torch.Tensor:
    try:
        return shard.get_tensor(key)
    except _UNREADABLE as error:
        raise CheckpointError(f"{path}: safetensors tensor {key!r} unreadable: {error}") from None
