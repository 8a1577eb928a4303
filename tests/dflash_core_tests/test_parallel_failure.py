"""A rank that dies leaves nothing behind: without rank 0 the others exit on their own and remove
its folders; without a follower, rank 0's next round fails fast with PeerLost (no hang)."""

from __future__ import annotations

import os
import subprocess
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

import psutil
import pytest
import torch
from parallel_helpers import GREEDY, PROMPTS, random_pair, start

from dflash_core.parallel.comm import PeerLost

pytestmark = pytest.mark.slow

RANK0 = textwrap.dedent("""
    import sys, time
    from dflash_core.parallel.layout import Layout
    from dflash_core.parallel.ranks import EngineRecipe, Ranks
    if __name__ == "__main__":
        ranks = Ranks(EngineRecipe(sys.argv[1], None, Layout(2), engine=dict(
            max_batch=1, max_context=16, max_tree_nodes=1), threads=1))
        print(ranks.processes[0].pid, flush=True)
        time.sleep(120)
""")


def test_followers_exit_and_remove_rank_0s_folders_when_it_is_killed(tmp_path):
    target, _ = random_pair(tmp_path, "qwen3")
    script = tmp_path / "rank0.py"
    script.write_text(RANK0)
    # A short folder of its own: the fork server's socket path must fit AF_UNIX's 108 bytes.
    scratch = Path(tempfile.mkdtemp(prefix="rk-"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "TMPDIR": str(scratch)}
    rank0 = subprocess.Popen([sys.executable, str(script), str(target)], stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        follower = psutil.Process(int(rank0.stdout.readline()))
        helpers = psutil.Process(rank0.pid).children(recursive=True)  # fork server, tracker
        assert len(list(scratch.iterdir())) == 2  # rendezvous, multiprocessing's
        rank0.kill()
        rank0.wait(10)
        gone, alive = psutil.wait_procs(helpers + [follower], timeout=15)
        assert not alive, alive
        assert list(scratch.iterdir()) == []
    finally:
        rank0.kill()
        shutil.rmtree(scratch, ignore_errors=True)


def test_rank_0_fails_fast_when_a_follower_is_killed(tmp_path):
    target, _ = random_pair(tmp_path, "qwen3")
    ranks = start(target, None, tp=2)
    try:
        ranks.processes[0].kill()
        ranks.processes[0].join(10)
        with pytest.raises(PeerLost), torch.inference_mode():
            ranks.engine.generate(PROMPTS, GREEDY)
    finally:
        ranks.close()
    assert not ranks.processes[0].is_alive()
