"""Analytic performance model of a serving node: the ``model`` backend."""

from backends.perf_model.backend import PerfModelBackend
from backends.perf_model.constants import Efficiency

__all__ = ["Efficiency", "PerfModelBackend"]
