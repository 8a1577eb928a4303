"""The integrity gates' verdicts: each failure names its gate; near-tie flips up to the allowed
count pass; a backend that cannot generate skips the probe and says so."""

from __future__ import annotations

from backends import FailureClass
from backends import LaunchParams
from backends import Measurement
from backends.session import Session
from tuner.config import GatesConfig
from tuner.launches.gates import Gates

DFLASH = LaunchParams(speculative_algorithm="dflash", speculative_dflash_block_size=8)
BEST = Measurement(concurrency=8, output_tok_s=800.0, accept_len_mean=3.2)


class Replies(Session):
    """A launch that answers the probe with fixed texts and fails levels when told to."""

    def __init__(self, texts: list[str] | None, fail: FailureClass | None = None) -> None:
        super().__init__()
        self.texts, self.fail, self.levels = texts, fail, []

    def _level(self, concurrency, requests):
        self.levels.append((concurrency, requests))
        if self.fail:
            return Measurement.failed(concurrency, self.fail, "illegal memory access")
        return Measurement(concurrency=concurrency, output_tok_s=800.0)

    def generate(self, prompts, max_tokens):
        if self.texts is None:
            return super().generate(prompts, max_tokens)
        return self.texts[:len(prompts)]


def _gates(**cfg) -> Gates:
    gates = Gates(GatesConfig(probe_prompts=4, soak_s=10.0, **cfg), [[1]] * 4, output_len=100)
    gates.record_reference(Replies(["a", "b", "c", "d"]))
    return gates


def test_a_lossless_winner_that_survives_the_soak_passes():
    session = Replies(["a", "b", "c", "X"])  # one near-tie flip is allowed by default
    assert _gates()(session, DFLASH, BEST) is None
    # The soak ran at the winner's own limit for ~soak_s seconds of its throughput.
    assert session.levels == [(8, 80)]


def test_outputs_that_differ_from_the_baseline_disqualify():
    verdict = _gates()(Replies(["a", "X", "Y", "d"]), DFLASH, BEST)
    assert verdict.startswith("gate losslessness") and "2 of 4" in verdict


def test_a_drafter_that_accepts_nothing_disqualifies():
    verdict = _gates()(Replies(["a", "b", "c", "d"]), DFLASH,
                       Measurement(concurrency=8, output_tok_s=800.0, accept_len_mean=1.0))
    assert verdict.startswith("gate acceptance")


def test_a_crash_under_sustained_load_disqualifies():
    verdict = _gates()(Replies(["a", "b", "c", "d"], fail=FailureClass.CRASH), DFLASH, BEST)
    assert verdict == "gate soak: crash after sustained load at concurrency 8"


def test_plain_decoding_needs_no_probe_and_a_backend_without_tokens_skips_it():
    assert _gates()(Replies(None), LaunchParams(), BEST) is None
    gates = Gates(GatesConfig(probe_prompts=4, soak_s=0.0), [[1]] * 4, output_len=100)
    gates.record_reference(Replies(None))
    assert gates(Replies(None), DFLASH, BEST) is None
    assert "does not generate tokens" in gates.skipped
