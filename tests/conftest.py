from __future__ import annotations

import pytest

# --- perf_model fixtures (tests/backends_tests/test_perf_model_*.py, test_contract.py) ----------
# Cheap, read-only catalog objects; the calibrated constants live in test_perf_model_reference.py.


@pytest.fixture(scope="session")
def pcie8_reference():
    """The user's node (8x RTX PRO 6000, PCIe, Kimi K2.6, SGLang): deployment and observations."""
    from backends.perf_model.references import load_reference

    return load_reference("pcie8_kimi_sglang")


@pytest.fixture(scope="session")
def kimi():
    from backends.perf_model.catalog import load_model

    return load_model("kimi-k2.6")


@pytest.fixture(scope="session")
def pcie_node():
    """RTX PRO 6000 Server on PCIe with the default (unfitted) efficiency constants."""
    from backends.perf_model.catalog import load_hardware
    from backends.perf_model.constants import Efficiency
    from backends.perf_model.step import Node

    return Node(load_hardware("rtx-pro-6000-server"), Efficiency())


# --- GPU marker: tests marked `gpu` are skipped where no CUDA device is visible -----------------


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in gpu_items:
            item.add_marker(skip)
