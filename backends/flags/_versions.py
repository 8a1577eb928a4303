"""Engine version strings and the inclusive ranges a flag table applies to."""

from __future__ import annotations

import re
from dataclasses import dataclass

from backends.errors import UserError

Version = tuple[int, int, int]

# Release suffixes pip shows for the same flag set (0.5.23.post1, 0.33.0rc1, 0.33.0+cu129).
_VERSION_RE = re.compile(
    r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.?(?:post|rc|dev|a|b)\d*)*(?:\+[\w.]+)?$"
)
_ANY_PATCH = 1 << 30  # a range ending in ".x" takes every patch release of that minor


def parse_version(text: str) -> Version:
    """Parse ``"0.5.23"`` (or ``"0.33"``, ``"0.33.0rc1"``) into ``(0, 5, 23)``.

    Raises ``ValueError`` for anything else.
    """
    match = _VERSION_RE.match(text.strip())
    if not match:
        raise UserError(f"cannot parse engine version {text!r}; expected e.g. '0.5.23'")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def _parse_bound(text: str) -> Version:
    if text.endswith(".x"):
        major, minor, _ = parse_version(text[:-2])
        return major, minor, _ANY_PATCH
    return parse_version(text)


@dataclass(slots=True, frozen=True)
class VersionRange:
    """Inclusive ``first``..``last``; ``last`` may end in ``.x`` (any patch release)."""

    first: str
    last: str

    def __contains__(self, version: Version) -> bool:
        return _parse_bound(self.first) <= version <= _parse_bound(self.last)

    def __str__(self) -> str:
        return self.first if self.first == self.last else f"{self.first}-{self.last}"
