"""Command-line options made from LaunchParams' fields, for every command that takes a launch
(`serve`, `generate`, `estimate`): one name (the tuning name, `--speculative-ddtree-budget`),
one help text and one default per knob, with `dflash-tune serve`'s own spelling
(backends.flags.dflash.FLAGS, what the tuner renders) and older spellings as aliases.

`launch_options(names, ...)` adds the options to a Typer command; the command receives
`launch`, a dict of the values that apply (given on the command line, else the command's own
defaults), ready for `LaunchParams(**launch)` once the command has filled in what it derives.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from typing import Annotated, Any

import typer

from backends.errors import UserError
from backends.flags.dflash import FLAGS
from backends.launch_params import LaunchParams

# Spellings users have in scripts from before the tuning names, kept as aliases.
OLD_SPELLINGS = {"tp_size": ("--tp",), "ep_size": ("--ep",), "cuda_graph": ("--cuda-graphs",)}
_FIELDS = {f.name: f for f in fields(LaunchParams)}
_TYPES = {"int | None": int, "int": int, "float": float, "str": str, "str | None": str,
          "bool": bool,
          "tuple[int, ...] | None": str}  # a list of ints is given as "1,2,4"


def spellings(name: str) -> tuple[str, ...]:
    """The option names of knob ``name``: the tuning name first, then its aliases."""
    names = [f"--{name.replace('_', '-')}", FLAGS.get(name), *OLD_SPELLINGS.get(name, ())]
    return tuple(dict.fromkeys(n for n in names if n))


def launch_options(names: Iterable[str], defaults: Mapping[str, Any] | None = None,
                   derived: Mapping[str, str] | None = None) -> Callable:
    """Decorate a command with an option per LaunchParams field in ``names``. ``defaults``
    replace a field's default for this command; ``derived`` names the fields the command
    works out itself when they are not given (their help says how, and `launch` leaves them
    out)."""
    names, defaults, derived = tuple(names), dict(defaults or {}), dict(derived or {})

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command, eval_str=True)
        kept = [p for p in signature.parameters.values() if p.name != "launch"]
        added = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None,
                                   annotation=_annotation(n, defaults, derived)) for n in names]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            given = {n: _value(n, kwargs.pop(n)) for n in names}
            launch = {**defaults, **{n: v for n, v in given.items() if v is not None}}
            return command(launch=launch, **kwargs)

        run.__signature__ = signature.replace(parameters=kept + added)
        run.__annotations__ = {p.name: p.annotation for p in kept + added}
        return run

    return decorate


def _annotation(name: str, defaults: Mapping[str, Any], derived: Mapping[str, str]):
    field = _FIELDS[name]
    kind = _TYPES[field.type]
    shown = derived[name] if name in derived else _shown(defaults.get(name, field.default))
    help = field.metadata["help"] + (f" (default: {shown})" if shown else "")
    decls = spellings(name)
    if kind is bool:
        decls = tuple(f"{d}/--no-{d.removeprefix('--')}" for d in decls)
    return Annotated[kind | None, typer.Option(*decls, help=help, show_default=False)]


def _shown(value: Any) -> str:
    if value is None:
        return ""  # the help says what no value means
    if isinstance(value, bool):
        return "on" if value else "off"
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _value(name: str, value: Any) -> Any:
    if value is None or _FIELDS[name].type != "tuple[int, ...] | None":
        return value
    if not value.strip():
        return None
    try:
        return tuple(int(b) for b in value.replace(",", " ").split())
    except ValueError:
        raise UserError(f"{spellings(name)[0]} wants integers separated by commas, got "
                        f"{value!r}") from None


# The options of a command that runs our engine on the machine at hand: one device and eager
# rounds unless asked (the tuning defaults describe an 8-GPU node), the method and block size
# from the drafter given.
ENGINE_DEFAULTS = {"tp_size": 1, "cuda_graph": False}
ENGINE_DERIVED = {"speculative_algorithm": "dflash with a drafter, else none",
                  "speculative_dflash_block_size": "the drafter's trained block",
                  "cuda_graph_bs": "none, eager rounds"}


def engine_launch(launch: Mapping[str, Any], drafter) -> LaunchParams:
    """`launch` (from `launch_options`) with what it leaves to the drafter filled in: the method
    (dflash with a drafter, else none), the block size (the drafter's trained one), graphs on
    when capture sizes are given. InvalidParams says what is wrong."""
    values = dict(launch)
    values.setdefault("speculative_algorithm", "dflash" if drafter else "none")
    if "speculative_dflash_block_size" not in values and drafter:
        from backends.engine_builder import read_drafter_config

        values["speculative_dflash_block_size"] = read_drafter_config(drafter).block_size
    if values.get("cuda_graph_bs"):
        values["cuda_graph"] = True
    return LaunchParams(**values)


def engine_params(drafter=None, **knobs: Any) -> LaunchParams:
    """The launch an engine command makes of ``knobs`` (tuning names) with ``drafter``: its
    defaults and derivations, as if given on the command line."""
    return engine_launch({**ENGINE_DEFAULTS, **knobs}, drafter)
