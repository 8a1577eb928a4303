"""Stop strings on a reply (reply.py) with a one-character-per-token tokenizer: a stop split
across rounds is cut where it starts and never half sent, and the longest stop list a request
may carry costs little per round."""

from __future__ import annotations

import time

from backends.dflash_server.loop import Event
from backends.dflash_server.protocol import MAX_STOP_CHARS, MAX_STOPS, Job, ServerInfo
from backends.dflash_server.reply import Reply
from dflash_core import SamplingParams


class Letters:
    """Token i is the letter chr(97 + i)."""

    def decode(self, ids, skip_special_tokens=True) -> str:
        return "".join(chr(97 + i) for i in ids)


def _reply(*stops: str) -> Reply:
    info = ServerInfo("m", Letters(), None, 4096, {})
    return Reply(info, False, Job([0], SamplingParams(max_tokens=4000), stops=stops))


def _ids(text: str) -> list[int]:
    return [ord(c) - 97 for c in text]


def test_a_stop_split_across_rounds_is_cut_where_it_starts_and_never_half_sent():
    reply = _reply("cde")
    sent = [reply.add(Event(_ids("abc")))[0], reply.add(Event(_ids("dxyz")))[0]]
    assert sent == ["ab", "cdxyz"]  # "c" held back until it could not start the stop
    reply = _reply("cde")
    first, _ = reply.add(Event(_ids("abc")))
    second, _ = reply.add(Event(_ids("def")))
    assert first + second == "ab" and reply.finish == "stop"
    assert reply.tokens == _ids("abcde")  # kept up to the token that completes the stop


def test_the_longest_stop_list_costs_little_per_round():
    stops = tuple("a" * (MAX_STOP_CHARS - 1) + chr(98 + i) for i in range(MAX_STOPS))
    reply = _reply(*stops)
    began = time.perf_counter()
    for _ in range(256):  # a stop's prefix all along: the worst case for holding text back
        reply.add(Event(_ids("a")))
    assert time.perf_counter() - began < 1.0
    assert reply.finish is None and len(reply.text) == 256 - (MAX_STOP_CHARS - 1)
