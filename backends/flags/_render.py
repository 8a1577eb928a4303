"""Entry points: pick an engine's dialect from the registry and render a launch with it."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from backends.errors import UserError
from backends.flags import dflash, sglang, vllm
from backends.flags._dialect import OVERLAPPED_DFLASH_ROUNDS, EngineDialect, LaunchTarget
from backends.flags._dialect import PrefillModel
from backends.launch_params import LaunchParams

_DIALECTS: dict[str, EngineDialect] = {"sglang": sglang.DIALECT, "vllm": vllm.DIALECT,
                                       "dflash": dflash.DIALECT}

ENGINES: tuple[str, ...] = tuple(_DIALECTS)
DEFAULT_VERSIONS: dict[str, str] = {name: d.default_version for name, d in _DIALECTS.items()}


def _dialect(engine: str) -> EngineDialect:
    try:
        return _DIALECTS[engine]
    except KeyError:
        known = ", ".join(ENGINES)
        raise UserError(f"unknown engine {engine!r}; known engines: {known}") from None


def _version(dialect: EngineDialect, version: str | None) -> str:
    # Only None means "the pinned default"; an empty string is a mistake worth reporting.
    return dialect.default_version if version is None else version


def engine_release(engine: str, version: str | None = None) -> str:
    """The release of ``engine`` a launch targets: ``version``, or the pinned one for None."""
    return _version(_dialect(engine), version)


def render_command(
    engine: str,
    params: LaunchParams,
    target: LaunchTarget,
    version: str | None = None,
    flag_overrides: Mapping[str, str | None] | None = None,
) -> list[str]:
    """The full argv that launches ``engine`` (at ``version``, default pinned) with ``params``.

    ``flag_overrides`` maps a logical flag key to a new spelling, or to ``None`` to drop the
    flag. Raises ``ValueError`` for an unknown engine, version or override key,
    ``InvalidParams`` for parameters no engine accepts and ``UnsupportedParams`` for ones this
    engine version cannot express. Environment the launch needs comes from :func:`render_env`.
    """
    dialect = _dialect(engine)
    out = dialect.argv(_version(dialect, version), flag_overrides or {})
    dialect.render(params, target, out)
    return [*out.args, *target.extra_args]


def render_env(engine: str, params: LaunchParams, version: str | None = None,
               target: LaunchTarget | None = None) -> dict[str, str]:
    """Environment variables the launch of ``params`` needs (knobs without a CLI flag), then
    ``target``'s own (the user's, which win)."""
    dialect = _dialect(engine)
    needed = dialect.env(params, dialect.table(_version(dialect, version)))
    return {**needed, **dict(target.env if target else ())}


def rounds_overlapped(engine: str, params: LaunchParams, version: str | None = None) -> bool:
    """Whether ``engine`` at ``version`` (default pinned) prepares each speculative round of
    ``params`` on the host while the GPU runs the previous one, so the round's scheduling and
    bookkeeping hide behind the GPU's time instead of adding to it. Only DFlash rounds, and only
    in releases whose table has the feature (SGLang from 0.5.14)."""
    if params.speculative_algorithm != "dflash":
        return False
    dialect = _dialect(engine)
    return OVERLAPPED_DFLASH_ROUNDS in dialect.table(_version(dialect, version)).features


def graphed_prefill_tokens(engine: str, params: LaunchParams, model: PrefillModel,
                           version: str | None = None) -> float:
    """The most tokens a prefill forward of ``model`` holds and still replays as CUDA graphs
    when ``engine`` at ``version`` (default pinned) serves it with ``params``: 0 where every
    prefill runs eagerly (SGLang's rules by release: ``sglang_prefill_graphs``; vLLM compiles
    its whole forward and our engine runs prefills eagerly)."""
    dialect = _dialect(engine)
    if dialect.graphed_prefill_tokens is None:
        return 0
    return dialect.graphed_prefill_tokens(params, _version(dialect, version), model)


def is_experimental(engine: str, params: LaunchParams) -> bool:
    """True when no released ``engine`` ships the configuration (DDTree, outside serve)."""
    return experimental_note(engine, params) is not None


def experimental_note(engine: str, params: LaunchParams) -> str | None:
    """What to say beside ``engine``'s command for ``params`` that no release of it runs."""
    note = _dialect(engine).ddtree_note
    return note if params.is_ddtree else None


def engine_label(engine: str, params: LaunchParams) -> str:
    """A short name for ``params`` naming only the knobs ``engine`` reads."""
    return _dialect(engine).label(params)


def default_port(engine: str) -> int:
    return _dialect(engine).default_port


def render_shell(argv: list[str]) -> str:
    """One copy-pasteable shell line; ``shlex.split`` gives ``argv`` back."""
    return shlex.join(argv)
