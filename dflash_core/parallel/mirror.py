"""Rank 0's live batch is the one the outside sees; every other rank keeps a replica of it.

Each call that changes a batch (open, admit, release, step, capture, feeding or dropping a
scratch sequence) is broadcast from rank 0 with its host arguments before rank 0 runs it, and
the other ranks make the same call. Their host bookkeeping then evolves as rank 0's does,
because a round's outputs are the same on every rank (gathered logits, one generator seed): each
rank reads its own round result once, and rank 0 never waits for theirs. A step carries rank 0's
committed lengths, which a replica checks against its own, so one that drifted stops (Desync)
instead of running collectives out of step.
Releases and drops touch no collective and ride along with the next broadcast.
"""

from __future__ import annotations

from dflash_core.parallel.comm import Comm, PeerLost


class Desync(RuntimeError):
    """A replica's batch no longer matches rank 0's."""


def mirrored(batch, comm: Comm | None, spec, rows: int, seed: int):
    """`batch` as rank 0 should drive it: wrapped so its calls reach the other ranks (who open
    the same batch now). Unchanged on one device and on the other ranks."""
    if comm is None or comm.world == 1 or not comm.leader:
        return batch
    leader = Leader(batch, comm)
    leader.send("open", spec, rows, seed)
    return leader


class Leader:
    def __init__(self, batch, comm: Comm) -> None:
        self.batch, self.comm, self.pending = batch, comm, []

    def __getattr__(self, name: str):  # everything that only reads: the batch's own
        return getattr(self.batch, name)

    def admit(self, prompts, samplings):
        self.send("admit", prompts, samplings)
        return self.batch.admit(prompts, samplings)

    def release(self, row: int) -> None:
        self.pending.append(("release", (row,)))
        self.batch.release(row)

    def step(self):
        self.send("step", list(self.batch.starts_h))
        self.batch.stats.comm.add("broadcast", self.comm.last_broadcast)  # a round's input
        return self.batch.step()

    def feed_scratch(self, key: int, ids: list[int]):
        self.send("feed_scratch", key, ids)
        return self.batch.feed_scratch(key, ids)

    def drop_scratch(self, key: int) -> None:
        self.pending.append(("drop_scratch", (key,)))
        self.batch.drop_scratch(key)

    def capture(self, read_lens=None, modes=("greedy",)):
        self.send("capture", read_lens, modes)
        return self.batch.capture(read_lens, modes)

    def send(self, op: str, *args) -> None:
        ops, self.pending = [*self.pending, (op, args)], []
        self.comm.broadcast(ops)


def stop_followers(comm: Comm | None) -> None:
    """Rank 0: end every other rank's `follow` loop."""
    if comm is not None and comm.world > 1 and comm.leader:
        comm.broadcast([("stop", ())])


def follow(engine, comm: Comm) -> None:
    """A non-zero rank: replay rank 0's batch calls on `engine` until rank 0 says stop."""
    batch = None
    while True:
        ops = comm.broadcast()
        for op, args in ops:
            if op == "stop":
                return
            if op == "open":
                batch = engine.open_batch(*args)
            elif op == "step":
                _check(batch, args[0], comm.rank)
                batch.stats.comm.add("broadcast", comm.last_broadcast)
                batch.step()
            else:
                _replay(batch, op, args)


# What a replica may see fail: rank 0 made the same call on the same state and failed the same
# way. A refused admission is refused before any work; a failed scoring fails only that request.
_TOLERATED = {"admit": ValueError, "feed_scratch": Exception}


def _replay(batch, op: str, args: tuple) -> None:
    try:
        getattr(batch, op)(*args)
    except (PeerLost, Desync):
        raise
    except Exception as error:  # re-raised unless rank 0 failed it the same way
        if not isinstance(error, _TOLERATED.get(op, ())):
            raise


def _check(batch, starts: list[int], rank: int) -> None:
    if list(batch.starts_h) != starts:
        raise Desync(f"rank {rank}: committed lengths {batch.starts_h} != rank 0's {starts}")
