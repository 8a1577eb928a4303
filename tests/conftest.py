from __future__ import annotations

import multiprocessing.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

import dflash_core  # noqa: F401  (keeps torch's compile cache out of the temporary directory)

# --- nothing left in the temporary directory ----------------------------------------------------
# The run gets a temporary directory of its own (TMPDIR, inherited by every xdist worker, server
# and rank it starts). Whatever is still in it when the run ends was left there by the code under
# test, and fails the run. pytest's own tmp_path folders live in it too and go with it (unless
# the run names its own --basetemp or PYTEST_DEBUG_TEMPROOT), so a run leaves nothing in /tmp.

_PRIVATE_TMP = pytest.StashKey[Path]()
# Inductor keeps its precompiled C++ headers under the temporary directory whatever
# TORCHINDUCTOR_CACHE_DIR says: torch's, not ours to move (removed with the rest).
_TORCH_OWN = "torchinductor_"
_PYTEST_OWN = "pytest-of-"  # tmp_path's root (pytest's, removed with the rest)


def pytest_configure(config):
    # This process's own multiprocessing folder is removed when it exits, after the check.
    tempfile.tempdir = os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir()
    multiprocessing.util.get_temp_dir()
    tempfile.tempdir = None
    if hasattr(config, "workerinput"):  # an xdist worker: the controller set TMPDIR for it
        return
    private = Path(tempfile.mkdtemp(prefix="dflash-tests-"))
    # As open as /tmp itself: servers the tests start as other users (PostgreSQL runs as
    # postgres) create their folders in it too.
    private.chmod(0o1777)
    os.environ["TMPDIR"] = str(private)
    # pytest makes its base folder on first use (workers get theirs inside the controller's).
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(private))
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    config.stash[_PRIVATE_TMP] = private


@pytest.hookimpl(trylast=True)  # after xdist has stopped its workers
def pytest_sessionfinish(session):
    private = session.config.stash.get(_PRIVATE_TMP, None)
    if private is None:
        return
    left = sorted(path.name for path in private.iterdir()
                  if not path.name.startswith((_TORCH_OWN, _PYTEST_OWN)))
    shutil.rmtree(private, ignore_errors=True)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"left in the temporary directory: {', '.join(left)}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
