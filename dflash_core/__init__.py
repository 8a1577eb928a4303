"""DFlash + DDTree speculative-decoding engine (PyTorch).

Imports nothing from ``tuner``, ``backends`` or ``search_spaces``. See docs/ENGINE.md.

    models/       what a checkpoint is and how its forward runs (config, loader, target, drafter)
    speculation/  what to draft, how trees are built, verified, accepted and sampled
    runtime/      the loop: the engine, live batches, fixed round shapes, CUDA graphs, the factory
    training/     the tiny pair's tokenizer, corpus and training

Imports point one way: runtime -> speculation -> models. The names below load on first use
(PEP 562), so ``import dflash_core.speculation.spec`` (METHODS, Spec, SamplingParams) does not
import torch: the tuner reads it without the engine extra installed.

Importing the package points torch.compile's cache at ``~/.cache/dflash-tune/torchinductor``
unless ``TORCHINDUCTOR_CACHE_DIR`` is set (runtime/compile_cache.py): torch creates it on first
use, and its default is the temporary directory."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from dflash_core.runtime.compile_cache import use_inductor_cache

use_inductor_cache()  # before any torch call: the first one creates Inductor's cache folder

_MODULE_OF = {
    "AcceptanceProfile": "speculation.oracle",
    "CheckpointError": "models.config",
    "DFlashProposer": "speculation.proposer",
    "DraftInput": "speculation.proposer",
    "Drafter": "models.drafter",
    "DrafterConfig": "models.config",
    "Engine": "runtime.engine",
    "EngineConfig": "runtime.engine",
    "Generation": "runtime.stats",
    "GenerationStats": "runtime.stats",
    "METHODS": "speculation.spec",
    "ModelConfig": "models.config",
    "OracleProposer": "speculation.oracle",
    "Proposer": "speculation.proposer",
    "SamplingParams": "speculation.spec",
    "Spec": "speculation.spec",
    "Target": "models.target",
    "build_engine": "runtime.factory",
    "load_drafter": "models.loader",
    "load_models": "runtime.factory",
    "load_target": "models.loader",
    "save_model": "models.loader",
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
    from dflash_core.models.config import CheckpointError, DrafterConfig, ModelConfig
    from dflash_core.models.drafter import Drafter
    from dflash_core.models.loader import load_drafter, load_target, save_model
    from dflash_core.models.target import Target
    from dflash_core.runtime.engine import Engine, EngineConfig
    from dflash_core.runtime.factory import build_engine, load_models
    from dflash_core.runtime.stats import Generation, GenerationStats
    from dflash_core.speculation.oracle import AcceptanceProfile, OracleProposer
    from dflash_core.speculation.proposer import DFlashProposer, DraftInput, Proposer
    from dflash_core.speculation.spec import METHODS, SamplingParams, Spec
