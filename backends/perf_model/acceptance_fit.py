"""The drafter's acceptance fitted to measured tokens per round.

Acceptance is the drafter's and the prompts' property, not the node's: before the node's
efficiency constants are fitted to measured throughput, the drafter's per-position acceptance
is scaled (one factor for every position) so that the model's mean accept length matches the
engine's measured one, else the constants absorb the drafter's error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from backends.contract import Workload
from backends.deployment import Deployment
from backends.launch_params import LaunchParams
from backends.perf_model.backend import PerfModelBackend
from backends.perf_model.constants import Efficiency

SCALES = tuple(s / 100 for s in range(50, 141, 2))  # tried factors, 0.5-1.4
MAX_ACCEPT = 0.99  # a position's acceptance stays a probability below 1


def fit_acceptance(deployment: Deployment, efficiency: Efficiency, workload: Workload,
                   measured: Sequence[tuple[LaunchParams, float]]) -> Deployment:
    """``deployment`` with its drafter's acceptance scaled to ``measured`` (a speculative launch
    and its measured mean accept length, bonus token included); unchanged without either."""
    drafter = deployment.drafter
    taus = [(launch, tau) for launch, tau in measured if launch.speculative and tau]
    if not taus or drafter is None:
        return deployment
    one = replace(workload, concurrency=(1,))

    def scaled(scale: float) -> Deployment:
        profile = tuple(min(MAX_ACCEPT, a * scale) for a in drafter.acceptance)
        return replace(deployment, drafter=replace(drafter, acceptance=profile))

    def error(scale: float) -> float:
        model = PerfModelBackend(scaled(scale), efficiency)
        return sum((model.measure(launch, one)[0].accept_len_mean - tau) ** 2
                   for launch, tau in taus)

    return scaled(min(SCALES, key=error))
