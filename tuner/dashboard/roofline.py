"""The performance model's roofline for a configuration: its step time on ideal hardware.

Ideal means datasheet memory bandwidth and (practically) no launch, fixed-matmul or collective
latency costs; what remains is bytes over bandwidth, FLOPs over tensor throughput and bytes over
the links. The gap between a configuration's step and this is what tuning could still win.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends.launch_params import LaunchParams
from tuner.config import Config

# Efficiency rejects zeros; a nanosecond is nothing against a millisecond step.
_NEGLIGIBLE_US = 1e-3


@dataclass(slots=True)
class Roofline:
    """Step times of the ideal node, one per configuration asked about."""

    cfg: Config
    backend: Any = None  # PerfModelBackend with ideal constants, built on first use

    def step_ms(self, launch: LaunchParams | None, concurrency: int) -> float | None:
        """Ideal ms per decode step at ``concurrency``; None when the model cannot place it."""
        from backends.perf_model.predict import predict
        from tuner.wiring import workload_from

        workload = workload_from(self.cfg)
        if launch is None:
            return None
        try:
            setup = self._backend().setup(launch, workload)
        # A configuration the model rejects, or a model / GPU its catalog does not know.
        except (ValueError, TypeError, KeyError, OSError):
            return None
        if setup.plan.infeasible:
            return None
        return sum(predict(setup, workload, concurrency).breakdown_ms.values())

    def _backend(self) -> Any:
        if self.backend is None:
            from backends import get_backend
            from backends.perf_model import Efficiency
            from tuner.wiring import deployment_from

            ideal = Efficiency(bandwidth_efficiency=1.0, collective_latency_us=_NEGLIGIBLE_US,
                               launch_overhead_us=_NEGLIGIBLE_US, matmul_fixed_us=_NEGLIGIBLE_US)
            self.backend = get_backend("model", deployment_from(self.cfg), efficiency=ideal)
        return self.backend
