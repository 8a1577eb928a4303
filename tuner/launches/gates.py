"""Integrity gates a winner must pass: it is lossless, its drafter does something, and it
survives sustained load. Each gate returns why it failed, or None.

- Losslessness: greedy outputs on a fixed probe set equal the no-speculation baseline's. In bf16
  a near-tie between two logits can flip one token between batch shapes (a different reduction
  order), so a documented number of prompts may differ; more than that is a broken verifier.
- Acceptance: a speculative configuration whose rounds average ~1 token has a drafter that
  proposes nothing useful (e.g. weights loaded under the wrong algorithm, accept_len 1.00).
- Soak: minutes of load at the configuration's own SLA limit; some failures (illegal memory
  accesses, leaks) appear only under sustained load, never in a short sweep.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends import Measurement
from backends.contract import ProbeUnsupported
from backends.launch_params import LaunchParams
from backends.session import Session
from tuner.config import GatesConfig


@dataclass
class Gates:
    cfg: GatesConfig
    prompts: list[list[int]]
    output_len: int
    reference: list[str] | None = None  # the baseline's greedy outputs
    skipped: str = ""  # why the probe could not run (the backend cannot generate)

    def record_reference(self, session: Session) -> None:
        """Run in the baseline's launch: its greedy outputs are what lossless means."""
        if self.cfg.probe_prompts:
            self.reference = self._probe(session)

    def __call__(self, session: Session, launch: LaunchParams, best: Measurement) -> str | None:
        return (self.acceptance(launch, best) or self.lossless(session, launch)
                or self.soak(session, best))

    def acceptance(self, launch: LaunchParams, best: Measurement) -> str | None:
        tau = best.accept_len_mean
        if not launch.speculative or tau is None:
            return None
        if tau < self.cfg.min_accept_len:
            return (f"gate acceptance: {tau:.2f} tokens per round (< "
                    f"{self.cfg.min_accept_len:g}); the drafter contributes nothing")
        return None

    def lossless(self, session: Session, launch: LaunchParams) -> str | None:
        if not self.cfg.probe_prompts or not launch.speculative:
            return None
        if self.reference is None:
            self.skipped = self.skipped or "the baseline's launch recorded no probe outputs"
            return None
        outputs = self._probe(session)
        if outputs is None:
            return None
        differ = [i for i, (a, b) in enumerate(zip(outputs, self.reference)) if a != b]
        if len(differ) > self.cfg.probe_mismatches_allowed:
            return (f"gate losslessness: greedy output differs from the baseline's on "
                    f"{len(differ)} of {len(outputs)} probe prompts (allowed "
                    f"{self.cfg.probe_mismatches_allowed}); first: prompt {differ[0]}")
        return None

    def soak(self, session: Session, best: Measurement) -> str | None:
        if not self.cfg.soak_s:
            return None
        c = best.concurrency
        requests = max(2 * c, round(self.cfg.soak_s * best.output_tok_s / self.output_len))
        m = session.measure(c, requests)
        if not m.ok:
            return f"gate soak: {m.failure.value} after sustained load at concurrency {c}"
        return None

    def _probe(self, session: Session) -> list[str] | None:
        try:
            return session.generate(self.prompts[:self.cfg.probe_prompts], self.cfg.probe_tokens)
        except ProbeUnsupported as why:
            self.skipped = str(why)
            return None
