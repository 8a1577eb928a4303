"""The one way a launch becomes a running dflash_core engine, for the in-process backend,
`dflash-tune serve` and `dflash-tune generate` alike.

`open_engine` reads the checkpoints' configs, maps the launch's knobs to the engine's Spec and
limits, refuses what cannot fit before anything is allocated (engine_limits), and builds the
engine on this process, or on tp_size ranks started here and stopped on the way out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.engine_limits import check_fits, free_memory
from backends.errors import UserError
from backends.launch_params import InvalidParams, LaunchParams, to_spec

DEVICES = ("cpu", "cuda")


@dataclass(slots=True, frozen=True)
class Checkpoints:
    target: Path
    drafter: Path | None = None


@dataclass(slots=True, frozen=True)
class EngineRuntime:
    """How this machine runs the engine: not tuned, not part of a launch's flags' meaning."""

    device: str = "cpu"  # cpu, cuda, cuda:1, ...
    dtype: str = "float32"  # a torch dtype name
    compile: str = "none"  # EngineConfig.compile
    threads: int | None = None  # torch threads of the engine on a CPU (None: its default)

    def __post_init__(self) -> None:
        if self.device.split(":")[0] not in DEVICES:
            raise UserError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.threads is not None and self.threads < 1:
            raise UserError(f"threads must be >= 1, got {self.threads}")


@dataclass(slots=True)
class OpenEngine:
    engine: Any  # dflash_core Engine (rank 0's over several ranks)
    spec: Any  # dflash_core Spec of the launch
    target_config: Any
    drafter_config: Any | None


Models = Callable[[], tuple[Any, Any]]  # -> (target, drafter): loaded models, on one device


@contextlib.contextmanager
def open_engine(launch: LaunchParams, checkpoints: Checkpoints, runtime: EngineRuntime, *,
                max_context: int, max_batch: int | None = None, models: Models | None = None,
                stage_timing: bool = False, exit_on_death: bool = False
                ) -> Iterator[OpenEngine]:
    """The engine ``launch`` describes, over requests of up to ``max_context`` tokens and
    ``max_batch`` rows (default: its running cap). ``models`` gives the loaded (target,
    drafter) on one device where the caller keeps them across engines (else they are loaded
    here). A launch the checkpoints or the memory cannot hold is a UserError (InvalidParams,
    or WontFit from engine_limits), raised before anything is allocated."""
    drafter_dir = checkpoints.drafter if launch.speculative else None
    target_cfg, drafter_cfg = read_configs(checkpoints.target, drafter_dir)
    spec = _spec(launch, drafter_cfg)
    _check_devices(runtime.device, launch.tp_size)
    batch = max_batch or launch.max_running_requests
    check_fits(target_cfg, drafter_cfg, spec, batch, max_context, _itemsize(runtime.dtype),
               free_memory(runtime.device))
    limits = dict(max_batch=batch, max_context=max_context, max_tree_nodes=spec.num_nodes,
                  batch_buckets=launch.capture_batch_sizes, compile=runtime.compile,
                  stage_timing=stage_timing)
    if launch.tp_size == 1:
        yield OpenEngine(_one_device(launch, checkpoints, runtime, models, limits), spec,
                         target_cfg, drafter_cfg)
        return
    from dflash_core.parallel.layout import Layout
    from dflash_core.parallel.ranks import EngineRecipe, Ranks

    ranks = Ranks(EngineRecipe(checkpoints.target, drafter_dir,
                               Layout(launch.tp_size, launch.ep_size), runtime.dtype,
                               runtime.device, limits), exit_on_death=exit_on_death)
    try:
        yield OpenEngine(ranks.engine, spec, target_cfg, drafter_cfg)
    finally:
        ranks.close()


def speculation(launch: LaunchParams, checkpoints: Checkpoints):
    """The Spec an engine for ``launch`` runs (from the configs alone; nothing is loaded)."""
    drafter_dir = checkpoints.drafter if launch.speculative else None
    return _spec(launch, read_drafter_config(drafter_dir) if drafter_dir else None)


def read_configs(target_dir: Path, drafter_dir: Path | None) -> tuple[Any, Any | None]:
    """The target's config (Qwen3 or DeepSeek) and the drafter's, from their config.json
    alone: over several ranks this process loads no full model."""
    from dflash_core.models.architectures import target_config
    from dflash_core.models.config import read_config

    drafter = read_drafter_config(drafter_dir) if drafter_dir else None
    return target_config(read_config(target_dir)), drafter


def read_drafter_config(drafter_dir: Path):
    from dflash_core import DrafterConfig
    from dflash_core.models.config import read_config

    return DrafterConfig.from_dict(read_config(drafter_dir))


def _check_devices(device: str, ranks: int) -> None:
    from dflash_core.parallel.ranks import check_devices

    try:
        check_devices(device, ranks)
    except ValueError as error:  # the launch asks for GPUs this machine lacks: the user's to fix
        raise InvalidParams(str(error)) from error


def _spec(launch: LaunchParams, drafter_cfg):
    trained = drafter_cfg.block_size if drafter_cfg else None
    if launch.speculative and trained is None:
        raise InvalidParams(f"speculative_algorithm={launch.speculative_algorithm} needs a "
                            "drafter checkpoint")
    if launch.speculative and launch.speculative_dflash_block_size > trained:
        raise InvalidParams(f"speculative_dflash_block_size={launch.speculative_dflash_block_size}"
                            f" is past the drafter's trained block, {trained}")
    return to_spec(launch, trained)


def _one_device(launch: LaunchParams, checkpoints: Checkpoints, runtime: EngineRuntime,
                models: Models | None, limits: dict):
    from dflash_core import build_engine, load_models

    if models is None:
        drafter_dir = checkpoints.drafter if launch.speculative else None
        target, drafter = load_models(checkpoints.target, drafter_dir, runtime.dtype,
                                      runtime.device)
    else:
        target, drafter = models()
    return build_engine(target, drafter if launch.speculative else None, **limits)


def _itemsize(dtype: str) -> int:
    from dflash_core.runtime.factory import as_dtype

    try:
        return as_dtype(dtype).itemsize
    except ValueError as error:
        raise UserError(str(error)) from None
