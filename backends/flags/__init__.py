"""Engine flag dialects: turn LaunchParams plus a launch target into an engine's exact argv.

One module per engine holds its flag tables per version range; :func:`render_command` picks the
table for the pinned version and applies the user's ``flag_overrides``.
"""

from __future__ import annotations

from backends.flags._dialect import LaunchTarget
from backends.flags._dialect import PrefillModel
from backends.flags._dialect import UnsupportedParams
from backends.flags._render import DEFAULT_VERSIONS
from backends.flags._render import ENGINES
from backends.flags._render import default_port
from backends.flags._render import engine_label
from backends.flags._render import engine_release
from backends.flags._render import experimental_note
from backends.flags._render import graphed_prefill_tokens
from backends.flags._render import is_experimental
from backends.flags._render import render_command
from backends.flags._render import render_env
from backends.flags._render import render_shell
from backends.flags._render import rounds_overlapped

__all__ = [
    "DEFAULT_VERSIONS",
    "ENGINES",
    "LaunchTarget",
    "PrefillModel",
    "UnsupportedParams",
    "default_port",
    "engine_label",
    "engine_release",
    "experimental_note",
    "graphed_prefill_tokens",
    "is_experimental",
    "render_command",
    "render_env",
    "render_shell",
    "rounds_overlapped",
]
