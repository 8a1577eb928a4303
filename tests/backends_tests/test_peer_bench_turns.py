"""bench/peer_bench.py's turns: every server follows every other in some repeat (a plain
rotation keeps the cycle, and what one server leaves running falls on the same next one)."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench" / "peer_bench.py"


def _peer_bench():
    spec = importlib.util.spec_from_file_location("peer_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH.parent))  # its `from harness import ...`, as when run there
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH.parent))
    return module


def _successions(order: list[str]) -> set[tuple[str, str]]:
    """(before, after) pairs of one repeat, the wrap to the next level included."""
    return {(a, b) for a, b in zip(order, order[1:] + order[:1])}


def test_every_server_follows_every_other_within_two_rounds_of_rotation():
    peer = _peer_bench()
    servers = ["ddtree", "dflash", "vllm"]
    orders = [peer.turn_order(servers, r) for r in range(2 * len(servers))]
    assert all(sorted(o) == sorted(servers) for o in orders)
    seen = set().union(*(_successions(o) for o in orders))
    assert seen == set(itertools.permutations(servers, 2))


def test_wait_quiet_returns_within_its_limit():
    waited = _peer_bench().wait_quiet(idle=1.01, window_s=0.05, limit_s=0.3)  # never idle enough
    assert 0.3 <= waited < 1.0
