"""What the real-vLLM tests share: the tiny pair on vLLM's CPU build, and the processes a
test's launches left (there must be none)."""

from __future__ import annotations

import os
import uuid

import psutil

from backends import vllm_cpu
from backends.deployment import Deployment
from backends.server_registry import TOKEN_VAR
from dflash_core.training.pair import ensure_pair

PAIR = ensure_pair()
# Marks the servers this test session starts (they inherit it), apart from any other tuner's.
OWNER_VAR = "DFLASH_TUNE_TEST_SESSION"
os.environ[OWNER_VAR] = uuid.uuid4().hex


def deployment(python, speculative: bool = True, **target) -> Deployment:
    """The shipped tiny pair on vLLM's CPU build."""
    drafter = PAIR / "drafter" if speculative else None
    return Deployment(gpu="rtx-pro-6000-server", gpus=1,
                      model=str(PAIR / "target" / "config.json"),
                      target=vllm_cpu.cpu_target(PAIR / "target", drafter, interpreter=python,
                                                 **target),
                      engine="vllm")


def server_processes() -> list[psutil.Process]:
    """Live processes that a launch of this pytest run started (a server and its workers
    carry the registry's token and this run's mark)."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if (TOKEN_VAR in env and env.get(OWNER_VAR) == os.environ[OWNER_VAR]
                    and proc.status() != psutil.STATUS_ZOMBIE):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found
