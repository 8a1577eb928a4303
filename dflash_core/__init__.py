"""DFlash + DDTree speculative-decoding engine (PyTorch).

Imports nothing from ``tuner``, ``backends`` or ``search_spaces``. See docs/ENGINE.md.

The names below load on first use (PEP 562), so ``import dflash_core.spec`` (METHODS, Spec,
SamplingParams) does not import torch: the tuner reads it without the engine extra installed.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_MODULE_OF = {
    "AcceptanceProfile": "oracle",
    "CheckpointError": "config",
    "DFlashProposer": "proposer",
    "DraftInput": "proposer",
    "Drafter": "drafter",
    "DrafterConfig": "config",
    "Engine": "engine",
    "EngineConfig": "engine",
    "Generation": "stats",
    "GenerationStats": "stats",
    "METHODS": "spec",
    "ModelConfig": "config",
    "OracleProposer": "oracle",
    "Proposer": "proposer",
    "SamplingParams": "spec",
    "Spec": "spec",
    "Target": "target",
    "build_engine": "factory",
    "load_drafter": "loader",
    "load_models": "factory",
    "load_target": "loader",
    "save_model": "loader",
}

__all__ = [
    "METHODS",
    "AcceptanceProfile",
    "CheckpointError",
    "DFlashProposer",
    "DraftInput",
    "Drafter",
    "DrafterConfig",
    "Engine",
    "EngineConfig",
    "Generation",
    "GenerationStats",
    "ModelConfig",
    "OracleProposer",
    "Proposer",
    "SamplingParams",
    "Spec",
    "Target",
    "build_engine",
    "load_drafter",
    "load_models",
    "load_target",
    "save_model",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what a type checker or IDE sees; never runs
    from dflash_core.config import CheckpointError, DrafterConfig, ModelConfig
    from dflash_core.drafter import Drafter
    from dflash_core.engine import Engine, EngineConfig
    from dflash_core.factory import build_engine, load_models
    from dflash_core.loader import load_drafter, load_target, save_model
    from dflash_core.oracle import AcceptanceProfile, OracleProposer
    from dflash_core.proposer import DFlashProposer, DraftInput, Proposer
    from dflash_core.spec import METHODS, SamplingParams, Spec
    from dflash_core.stats import Generation, GenerationStats
    from dflash_core.target import Target
