"""torch creates Inductor's cache folder when Dynamo is first imported (many calls import it,
compiling or not); importing dflash_core first puts it in the user's cache folder instead of the
temporary directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FIRST_TORCH_CALL = ("import dflash_core, torch._dynamo, os; "
                    "print(os.environ['TORCHINDUCTOR_CACHE_DIR'])")


def _run(tmp_path: Path, **env: str) -> Path:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", FIRST_TORCH_CALL], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).parents[2],
                         env={**clean, "TMPDIR": str(tmp_path / "tmp"), **env}).stdout
    return Path(out.strip())


def test_inductor_cache_goes_to_the_users_cache_not_the_temporary_directory(tmp_path):
    used = _run(tmp_path, XDG_CACHE_HOME=str(tmp_path / "cache"))
    assert used == tmp_path / "cache" / "dflash-tune" / "torchinductor" and used.is_dir()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_set_inductor_cache_dir_is_kept(tmp_path):
    used = _run(tmp_path, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "mine"))
    assert used == tmp_path / "mine" and used.is_dir()
