"""Starting the ranks of one engine: rank 0 is the calling process, ranks 1.. are started by a
fork server that has imported torch once, and all meet through a rendezvous file, so parallel
test workers and servers never fight over a port. One set of ranks per process at a time (a
process has one default process group).

Every rank builds the same engine from one `EngineRecipe`; the others then replay rank 0's batch
calls (mirror.follow). A rank that dies takes the rest with it: rank 0 watches its followers'
process sentinels and stops the others when one exits (rank 0's next collective then raises
PeerLost; with `exit_on_death` the process exits, since a server cannot serve with a rank
missing), and a follower whose rank 0 is gone exits at once.

What rank 0 leaves in the temporary directory (the rendezvous folder, and multiprocessing's
folder that holds the fork server's socket) goes when it closes the ranks or exits normally;
when it is killed, the followers remove it as they exit, whichever way they go (their watch on
rank 0, or a collective that fails first). A group killed whole (SIGKILL to every process)
cleans nothing: a server launched by the tuner has a temporary directory of its own for that,
removed with the launch (backends/server.py).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch

from dflash_core.parallel.comm import Comm, close_comm, init_comm
from dflash_core.parallel.layout import Layout
from dflash_core.parallel.mirror import follow, stop_followers
from dflash_core.parallel.shard import checked_config

EXIT_RANK_LOST = 1  # not argparse's 2: the tuner reads it as a crash
RANK_0_EXIT_S = 5.0  # how long a killed rank 0 may take to exit (freeing its memory)


@dataclass(slots=True)
class EngineRecipe:
    """What every rank builds: the checkpoints, its device, the layout and build_engine's
    keyword arguments (the same on every rank)."""

    target: Path
    drafter: Path | None
    layout: Layout
    dtype: str = "float32"
    device: str = "cpu"  # "cuda": rank r on cuda:r (NCCL refuses two ranks on one GPU)
    engine: dict = field(default_factory=dict)
    threads: int = 0  # intra-op threads per rank (0: on the CPU, its cores shared out)
    # Makes the proposer from the target instead of the drafter's DFlash (an oracle in tests);
    # a module-level function, so it pickles to the other ranks.
    proposer: Callable | None = None

    def rank_threads(self) -> int:
        """Threads each rank runs: the CPU's cores shared out, so ranks do not oversubscribe."""
        if self.threads or torch.device(self.device).type != "cpu":
            return self.threads
        return max(1, (os.cpu_count() or 1) // self.layout.world)

    def rank_device(self, rank: int) -> torch.device:
        device = torch.device(self.device)
        if device.type == "cuda" and device.index is None:
            return torch.device("cuda", rank)
        return device


def check_devices(device: str, world: int) -> None:
    """Refuse a CUDA layout with more ranks than GPUs (ValueError): NCCL will not put two ranks
    of one communicator on the same device. Ranks checks it before forking."""
    where = torch.device(device)
    if where.type != "cuda" or world == 1:
        return
    found = torch.cuda.device_count()
    if where.index is not None or world > found:
        raise ValueError(f"{world} ranks on CUDA need {world} GPUs, one each (device "
                         f"{device!r}, {found} found): NCCL refuses two ranks on one GPU")


def build_rank_engine(recipe: EngineRecipe, comm: Comm | None):
    from dflash_core.runtime.factory import build_engine, load_models

    device = recipe.rank_device(comm.rank if comm else 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    target, drafter = load_models(recipe.target, recipe.drafter, recipe.dtype, device,
                                  recipe.layout, comm)
    proposer = recipe.proposer(target) if recipe.proposer else None
    return build_engine(target, drafter, proposer=proposer, **recipe.engine)


class Ranks:
    """Rank 0's handle on a running set of ranks: `engine` is rank 0's; `close` stops all."""

    def __init__(self, recipe: EngineRecipe, exit_on_death: bool = False) -> None:
        world = recipe.layout.world
        if torch.distributed.is_initialized():
            raise RuntimeError("this process already holds a set of ranks: close it first")
        checked_config(recipe.target, recipe.layout)  # refuse a split it cannot make, unforked
        check_devices(recipe.device, world)
        self._folder = tempfile.mkdtemp(prefix="dflash-ranks-")
        init = f"file://{self._folder}/rendezvous"
        context = _context()
        leftovers = self._leftovers()
        self.processes = [context.Process(target=_follower_main, daemon=True,
                                          name=f"dflash-rank{rank}",
                                          args=(rank, recipe, init, os.getpid(), leftovers))
                          for rank in range(1, world)]
        self._closing, self.exit_on_death = False, exit_on_death
        self._threads = torch.get_num_threads()  # rank 0's process gets its own back on close
        for process in self.processes:
            process.start()
        self._watchdog = threading.Thread(target=self._watch, name="rank-watchdog", daemon=True)
        self._watchdog.start()
        try:
            _set_threads(recipe.rank_threads())
            self.comm = init_comm(0, world, init, recipe.rank_device(0))
            self.engine = build_rank_engine(recipe, self.comm)
        except BaseException:
            self.close()
            raise

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the followers (politely, then by force) and leave the process group."""
        self._closing = True
        try:
            if getattr(self, "comm", None) is not None and self.alive():
                stop_followers(self.comm)
        except RuntimeError:  # a follower already gone: nothing to tell
            pass
        deadline = time.monotonic() + timeout_s
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        self._stop_all()
        close_comm()
        shutil.rmtree(self._folder, ignore_errors=True)
        _stop_helpers()
        torch.set_num_threads(self._threads)

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.processes)

    def _leftovers(self) -> tuple[str, ...]:
        """What this process leaves in the temporary directory if it dies without cleanup: the
        rendezvous folder, and multiprocessing's (the fork server's socket is made in it)."""
        return self._folder, multiprocessing.util.get_temp_dir()

    def _stop_all(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join(5)

    def _watch(self) -> None:
        sentinels = {p.sentinel: p for p in self.processes}
        while sentinels and not self._closing:
            for ready in multiprocessing.connection.wait(list(sentinels), timeout=0.5):
                process = sentinels.pop(ready)
                if not self._closing:
                    rank = self.processes.index(process) + 1
                    print(f"dflash-tune: rank {rank} exited (code {process.exitcode}); "
                          "stopping every rank", file=sys.stderr, flush=True)
                    self._stop_all()
                    if self.exit_on_death:  # os._exit runs no cleanup: the folders go first
                        _remove(self._leftovers())
                        os._exit(EXIT_RANK_LOST)
                    return


def _context():
    """A fork server that has imported torch and this package once: each rank then starts in
    a fraction of a second instead of importing torch itself (seconds, per rank)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, "dflash_core.runtime.factory"])
    return context


def _stop_helpers() -> None:
    """Stop the fork server and the resource tracker it started, so a closed set of ranks leaves
    no process behind (the next set starts them again). Private to multiprocessing, hence the
    guard."""
    from multiprocessing import forkserver, resource_tracker

    for helper in (forkserver._forkserver, resource_tracker._resource_tracker):
        stop = getattr(helper, "_stop", None)
        if stop is not None:
            stop()


def _follower_main(rank: int, recipe: EngineRecipe, init: str, parent: int,
                   leftovers: tuple[str, ...]) -> None:
    threading.Thread(target=_exit_with_parent, args=(parent, leftovers), daemon=True).start()
    try:
        _set_threads(recipe.rank_threads())
        comm = init_comm(rank, recipe.layout.world, init, recipe.rank_device(rank))
        engine = build_rank_engine(recipe, comm)
        with torch.inference_mode():
            follow(engine, comm)
        close_comm()
    except BaseException:
        # A killed rank 0 closes its sockets before it is gone: the failed collective comes
        # first, so give it a moment to be gone for the leftovers to be removed.
        if _gone_within(parent, RANK_0_EXIT_S):
            _remove(leftovers)
        raise


def _exit_with_parent(parent: int, leftovers: tuple[str, ...]) -> None:
    """Rank 0 is not our OS parent (the fork server is), so poll for it by pid; a rank 0 that
    was killed left its folders behind, which go too."""
    while _alive(parent):
        time.sleep(0.2)
    _remove(leftovers)
    os._exit(1)


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _alive(pid: int) -> bool:
    """A killed rank 0 stays a zombie until its parent reaps it (and for ever under a PID 1 that
    reaps nothing), and a zombie still answers a signal 0: it counts as gone."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _remove(folders: tuple[str, ...]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _set_threads(threads: int) -> None:
    if threads:
        torch.set_num_threads(threads)
