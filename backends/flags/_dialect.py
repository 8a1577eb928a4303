"""What a flag dialect is made of: version tables, the launch target, and the argv builder.

A dialect maps *logical flag keys* (stable names such as ``cuda_graph_max_bs``) to the spelling
one engine release accepts. An engine's renderer only ever names logical keys; which spelling comes
out is decided by the table for the pinned version, then by the user's overrides.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from backends.errors import UserError
from backends.flags._versions import VersionRange
from backends.flags._versions import parse_version
from backends.launch_params import InvalidParams
from backends.launch_params import LaunchParams


# A release whose scheduler prepares a DFlash round on the host while the GPU runs the previous
# one (SGLang's overlap scheduler with its spec-v2 DFlash worker) has this table feature.
OVERLAPPED_DFLASH_ROUNDS = "overlapped_dflash_rounds"
# A release that serves DFlash speculative decoding (SGLang's DFLASH, from 0.5.11).
DFLASH_SPECULATION = "dflash_speculation"


@dataclass(slots=True, frozen=True)
class PrefillModel:
    """What an engine's prefill-graph rules read of a model and its GPU."""

    architecture: str  # the Hugging Face config's ``architectures[0]``
    mla: bool  # multi-head latent attention (DeepSeek-V3's layout)
    linear_attention: bool  # a Kimi Delta Attention hybrid
    compute_capability: float  # the GPU's (10.0 for B200); 0 where unknown


class UnsupportedParams(InvalidParams):
    """A valid configuration that this engine (at this version) cannot express."""


@dataclass(slots=True, frozen=True)
class LaunchTarget:
    """Where and what to launch; everything in the command that is not a tuned parameter."""

    model_path: str
    drafter_path: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    context_length: int | None = None
    trust_remote_code: bool = True
    extra_args: tuple[str, ...] = ()  # appended verbatim at the end
    # The command that starts the engine, in place of its usual one (`vllm serve`,
    # `python -m sglang.launch_server`, `dflash-tune serve`): a venv's interpreter, a wrapper.
    launcher: tuple[str, ...] = ()
    # Set for the server and printed before its command; the user's, over any the engine needs.
    env: tuple[tuple[str, str], ...] = ()
    # "cuda", or "cpu" for an engine's CPU build (vLLM's: no CUDA graphs; the KV cache is sized
    # in bytes, since its memory fraction would be a fraction of the host's RAM).
    device: str = "cuda"
    kv_cache_bytes: int | None = None  # device "cpu": the KV cache (None: the engine's CPU default)

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise UserError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")

    def head(self, *default: str) -> tuple[str, ...]:
        """The command that starts the engine: the launcher if one is set, else `default`."""
        return self.launcher or default


DEVICES = ("cuda", "cpu")


@dataclass(slots=True, frozen=True)
class FlagTable:
    """Flag spellings valid for one inclusive range of engine versions.

    A key missing from ``flags`` means the concept has no flag in these versions; renderers test
    membership to pick between spellings that differ in shape (one switch vs. two valued flags).
    ``features`` names behaviour that is not a flag (e.g. whether a combination is accepted).
    """

    versions: VersionRange
    flags: Mapping[str, str]
    features: frozenset[str] = frozenset()


@dataclass(slots=True)
class Argv:
    """Builds one command from logical keys; a key overridden to ``None`` is left out."""

    label: str  # "SGLang 0.5.23", for error messages
    spellings: dict[str, str | None]
    features: frozenset[str]
    args: list[str] = field(default_factory=list)

    def has(self, key: str) -> bool:
        return key in self.spellings

    def raw(self, *args: str) -> None:
        self.args.extend(args)

    def add(self, key: str, *values: Any) -> None:
        spelling = self.spellings[key]
        if spelling is not None:
            self.args.extend([spelling, *(str(v) for v in values)])


Renderer = Callable[[LaunchParams, LaunchTarget, Argv], None]
EnvRenderer = Callable[[LaunchParams, FlagTable], dict[str, str]]


@dataclass(slots=True, frozen=True)
class EngineDialect:
    """One engine's flag tables (oldest first) and the functions that render with them."""

    display_name: str
    default_version: str
    tables: tuple[FlagTable, ...]
    render: Renderer
    env: EnvRenderer
    default_port: int  # where the engine listens unless told otherwise
    # A short name for a configuration, naming only knobs the engine reads.
    label: Callable[[LaunchParams], str] = LaunchParams.label
    # Said beside a command with DDTree when no release of the engine has it (None: one has).
    ddtree_note: str | None = None
    # The most tokens a prefill forward holds and still runs as CUDA graphs, for a launch, a
    # release and a model (None: the engine runs every prefill eagerly, or compiles its forward).
    graphed_prefill_tokens: Callable[[LaunchParams, str, PrefillModel], float] | None = None

    def table(self, version: str) -> FlagTable:
        """The table for ``version``; ``ValueError`` listing the supported ranges otherwise."""
        parsed = parse_version(version)
        for table in self.tables:
            if parsed in table.versions:
                return table
        ranges = ", ".join(str(t.versions) for t in self.tables)
        raise UserError(
            f"{self.display_name} {version} is not supported; supported versions: {ranges}"
        )

    def known_keys(self) -> list[str]:
        return sorted({key for table in self.tables for key in table.flags})

    def argv(self, version: str, overrides: Mapping[str, str | None]) -> Argv:
        """An empty builder for ``version`` with ``overrides`` applied (checked against keys)."""
        table = self.table(version)
        self._check_overrides(overrides)
        # Overrides of keys this version lacks are ignored: they belong to another version.
        spellings = {key: overrides.get(key, flag) for key, flag in table.flags.items()}
        return Argv(f"{self.display_name} {version}", spellings, table.features)

    def _check_overrides(self, overrides: Mapping[str, str | None]) -> None:
        known = self.known_keys()
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise UserError(
                f"unknown {self.display_name} flag override key(s) {', '.join(unknown)}; "
                f"known keys: {', '.join(known)}"
            )
        for key, spelling in overrides.items():
            looks_like_flag = isinstance(spelling, str) and spelling.startswith("-")
            if spelling is not None and not looks_like_flag:
                raise UserError(
                    f"flag override {key}: {spelling!r} must be a flag such as '--x-y' or null"
                )


def compact_json(value: Any) -> str:
    """One argv element of JSON, stable across runs (sorted keys, no spaces)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def fraction(value: float) -> str:
    """``0.88`` -> ``"0.88"``: three decimals at most, no float noise."""
    return repr(round(value, 3))


def refuse_knobs(params: LaunchParams, label: str, why: Mapping[str, str]) -> None:
    """UnsupportedParams for the first knob of ``why`` (name -> reason) that ``params`` sets
    away from its default: an engine never drops a knob it cannot express."""
    chosen = params.non_default()
    for name, reason in why.items():
        if name in chosen:
            raise UnsupportedParams(f"{label} cannot express {name}={chosen[name]!r}: {reason}")


def kv_cache_dtype(params: LaunchParams, out: Argv) -> None:
    """``--kv-cache-dtype`` where the launch sets one (SGLang and vLLM spell it and its 8-bit
    values alike); ``auto`` is both engines' default and is left out."""
    if params.kv_cache_dtype != "auto":
        out.add("kv_cache_dtype", params.kv_cache_dtype)


def nccl_env(params: LaunchParams) -> dict[str, str]:
    """NCCL's variables for the launch's collectives (every engine here runs them on NCCL);
    a knob left at None leaves its variable to NCCL."""
    env = {"NCCL_PROTO": params.nccl_proto, "NCCL_P2P_LEVEL": params.nccl_p2p_level}
    return {name: value for name, value in env.items() if value is not None}


def require_drafter(params: LaunchParams, target: LaunchTarget, label: str) -> str:
    if target.drafter_path is None:
        raise UnsupportedParams(
            f"{label}: speculative_algorithm={params.speculative_algorithm} needs drafter_path "
            "in the launch target"
        )
    return target.drafter_path
