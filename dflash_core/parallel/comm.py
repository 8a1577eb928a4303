"""The collectives a sharded model calls, each counted in `traffic` (calls and bytes by kind).

Compute collectives run on the process group of the device (NCCL on CUDA, gloo on CPU); host
messages (rank 0's round inputs) on a gloo group of their own, so they never wait behind, or
enter, a captured CUDA graph. A collective that fails because a peer is gone raises PeerLost
with one line, not the transport's text (which reads like a transient network error).
"""

from __future__ import annotations

import pickle
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from dflash_core.parallel.traffic import Traffic

TIMEOUT = timedelta(minutes=2)  # rendezvous and compute collectives
# The other ranks wait for rank 0's next message as long as a server sits idle.
IDLE = timedelta(days=365)


class PeerLost(RuntimeError):
    """A collective failed: another rank of the group stopped or died."""


class Comm:
    def __init__(self, rank: int, world: int, group=None, control=None) -> None:
        self.rank, self.world, self.group, self.control = rank, world, group, control
        self.traffic = Traffic()
        self.last_broadcast = 0  # bytes of the latest broadcast

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: Tensor) -> Tensor:
        """Sum over ranks, in place; returns x."""
        self.traffic.add("all_reduce", x.numel() * x.element_size())
        _guarded(dist.all_reduce, x, group=self.group)
        return x

    def all_gather(self, x: Tensor) -> Tensor:
        """[..., n] on every rank -> [..., world * n], rank order along the last dimension."""
        out = x.new_empty(self.world * x.numel())  # gloo gathers flat buffers only
        self.traffic.add("all_gather", out.numel() * out.element_size())
        _guarded(_GATHER, out, x.reshape(-1), group=self.group)
        return out.view(self.world, *x.shape).movedim(0, -2).flatten(-2)  # [..., W * n]

    def broadcast(self, message=None):
        """Rank 0's picklable `message` on every rank (host values; the gloo control group)."""
        if self.leader:
            payload = torch.frombuffer(bytearray(pickle.dumps(message)), dtype=torch.uint8)
            size = torch.tensor([len(payload)])
        else:
            size = torch.zeros(1, dtype=torch.long)
        _guarded(dist.broadcast, size, 0, group=self.control)
        if not self.leader:
            payload = torch.empty(int(size), dtype=torch.uint8)
        _guarded(dist.broadcast, payload, 0, group=self.control)
        self.last_broadcast = int(size) + size.element_size()
        self.traffic.add("broadcast", self.last_broadcast)
        return message if self.leader else pickle.loads(payload.numpy().tobytes())


def init_comm(rank: int, world: int, init_method: str, device: torch.device) -> Comm:
    """Join the `world` ranks meeting at `init_method` (ranks.py uses a file://; any
    torch.distributed init method works). NCCL on a CUDA device, gloo on the CPU; the control
    group is always gloo."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    options = dict(device_id=device) if backend == "nccl" else {}
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=TIMEOUT, **options)
    control = dist.new_group(backend="gloo", timeout=IDLE)
    return Comm(rank, world, dist.group.WORLD, control)


def close_comm() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


_GATHER = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
# How gloo and NCCL say that the other end went away (or never answered).
_PEER_GONE = ("closed by peer", "reset by peer", "Broken pipe", "Connection refused",
              "timed out", "Timed out", "Timeout", "NCCL communicator was aborted")


def _guarded(collective, *args, **kwargs) -> None:
    try:
        collective(*args, **kwargs)
    except RuntimeError as error:
        if not any(text in str(error) for text in _PEER_GONE):
            raise
        raise PeerLost(f"{collective.__name__} failed: a peer rank stopped") from None
