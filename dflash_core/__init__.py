"""DFlash + DDTree speculative-decoding engine (PyTorch).

Imports nothing from ``tuner``, ``backends`` or ``search_spaces``. See docs/ENGINE.md.
"""

from dflash_core.config import CheckpointError, DrafterConfig, ModelConfig
from dflash_core.drafter import Drafter
from dflash_core.engine import Engine, EngineConfig
from dflash_core.loader import load_drafter, load_target, save_model
from dflash_core.oracle import AcceptanceProfile, OracleProposer
from dflash_core.proposer import DFlashProposer, DraftInput, Proposer
from dflash_core.spec import SamplingParams, Spec
from dflash_core.stats import Generation, GenerationStats
from dflash_core.target import Target

__all__ = [
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
    "load_drafter",
    "load_target",
    "save_model",
]
