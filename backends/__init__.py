"""Ways to run a configuration and measure it, behind one contract (:class:`Backend`).

``BACKENDS`` maps a name to a factory taking a :class:`Deployment`; heavy backends import their
dependencies inside the factory so that listing backends stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable

from backends.base import Backend
from backends.contract import FailureClass, LaunchFailed, Measurement, Workload
from backends.deployment import Deployment, DrafterSpec
from backends.errors import UserError
from backends.launch_params import InvalidParams, LaunchParams


def _model_backend(deployment: Deployment, **options) -> Backend:
    from backends.perf_model import PerfModelBackend

    return PerfModelBackend(deployment, **options)


def _server_backend(name: str) -> Callable[..., Backend]:
    def factory(deployment: Deployment, **options) -> Backend:
        from backends import serving

        classes = {"sglang": serving.SGLangBackend, "vllm": serving.VLLMBackend,
                   "serve": serving.DFlashServeBackend}
        return classes[name](deployment, **options)

    return factory


def _inprocess_backend(deployment: Deployment, **options) -> Backend:
    from backends.inprocess import InProcessBackend

    return InProcessBackend(deployment, **options)


def _simulated_backend(deployment: Deployment, efficiency=None, simulation=None,
                       truth_efficiency=None, truth_acceptance=None) -> Backend:
    """The performance model as hidden truth (its own constants and acceptance when given),
    measured with noise and launch cost."""
    from dataclasses import replace

    from backends.perf_model import PerfModelBackend
    from backends.simulated import SimulatedBackend, Simulation

    if truth_acceptance is not None and deployment.drafter is not None:
        drafter = replace(deployment.drafter, acceptance=tuple(truth_acceptance))
        deployment = replace(deployment, drafter=drafter)
    truth = PerfModelBackend(deployment, truth_efficiency or efficiency)
    return SimulatedBackend(truth, simulation or Simulation())


BACKENDS: dict[str, Callable[..., Backend]] = {
    "model": _model_backend,
    "sglang": _server_backend("sglang"),
    "vllm": _server_backend("vllm"),
    "serve": _server_backend("serve"),
    "inprocess": _inprocess_backend,
    "simulated": _simulated_backend,
}


def get_backend(name: str, deployment: Deployment, **options) -> Backend:
    if name not in BACKENDS:
        raise UserError(f"unknown backend {name!r}; available: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name](deployment, **options)


__all__ = ["BACKENDS", "Backend", "Deployment", "DrafterSpec", "FailureClass", "InvalidParams",
           "LaunchFailed", "LaunchParams", "Measurement", "Workload", "get_backend"]
