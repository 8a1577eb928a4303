"""runtime/profile.py: per-stage op counts are exact and land in the stage that ran them."""

from __future__ import annotations

import torch
from core_helpers import BLOCK, PROMPTS, dflash_engine

from dflash_core import SamplingParams, Spec
from dflash_core.runtime.profile import profile_rounds


def _profile(engine, spec):
    with torch.inference_mode():
        batch = engine.open_batch(spec, len(PROMPTS))
        batch.admit(PROMPTS, [SamplingParams(max_tokens=40)] * len(PROMPTS))
        return profile_rounds(batch, 2)


def test_round_profile_counts_the_same_ops_every_time_per_stage():
    engine = dflash_engine()
    first, second = (_profile(engine, Spec.dflash(BLOCK)) for _ in range(2))
    ops = {s: p.ops for s, p in first.stages.items()}
    assert ops == {s: p.ops for s, p in second.stages.items()}
    assert {"draft", "build", "verify", "accept", "commit", "host"} <= set(ops)
    assert ops["verify"] > ops["build"] > 0 and ops["draft"] > 0
    assert first.total.ops == sum(ops.values()) and first.total.wall_ms > 0


def test_plain_rounds_dispatch_nothing_in_the_draft_stage():
    prof = _profile(dflash_engine(), Spec.none())
    assert prof.stages["draft"].ops == 0 and prof.stages["verify"].ops > 0
