"""One GPU of a node: its datasheet, its fitted efficiencies and its measured kernel tables."""

from __future__ import annotations

import math
from dataclasses import dataclass

from backends.perf_model import constants as C
from backends.perf_model.catalog import Hardware
from backends.perf_model.constants import Efficiency
from backends.perf_model.kernels.tables import KernelTables


@dataclass(slots=True, frozen=True)
class Node:
    """``kernels``: the measured tables of this GPU under the deployment's engine (None: every
    term is a roofline, from the datasheet and the fitted efficiencies). ``engine``: the
    deployment's engine (sglang, vllm, dflash), whose code paths a step follows (streams.py)."""

    hw: Hardware
    eff: Efficiency
    kernels: KernelTables | None = None
    engine: str = "sglang"

    @property
    def nvlink(self) -> bool:
        return self.hw.interconnect.startswith("nvlink")

    def mem_ms(self, nbytes: float, efficiency: float | None = None) -> float:
        e = self.eff.bandwidth_efficiency if efficiency is None else efficiency
        return nbytes / (self.hw.bandwidth_gbs * 1e9 * e) * 1e3

    def compute_ms(self, flops: float, rows: float, efficiency: float | None = None) -> float:
        """Tensor work of GEMMs ``rows`` tall: small shapes reach less of the peak."""
        e = self.eff.compute_efficiency if efficiency is None else efficiency
        shape = 1.0 if math.isinf(rows) else rows / (rows + C.GEMM_HALF_ROWS)
        return flops / (self.hw.bf16_tflops * 1e12 * e * shape) * 1e3

    def linear_ms(self, nbytes: float, flops: float, rows: float) -> float:
        """Weight-streaming GEMMs: a roofline, bound by the weight stream or by tensor work."""
        return max(self.mem_ms(nbytes), self.compute_ms(flops, rows))

    def sol_ms(self, nbytes: float, flops: float) -> float:
        """The datasheet limit: every byte at full bandwidth, or every FLOP at full peak."""
        return max(self.mem_ms(nbytes, 1.0), self.compute_ms(flops, math.inf, 1.0))

    def wire_ms(self, nbytes: float) -> float:
        return nbytes / (self.hw.link_gbs * 1e9) * 1e3

    def collective_ms(self, nbytes: float, group: int, all_reduce: bool) -> float:
        """Ring collective over ``group`` GPUs: all-reduce moves twice an all-gather's bytes."""
        if group <= 1:
            return 0.0
        factor = 2.0 if all_reduce else 1.0
        return (self.eff.collective_latency_us / 1e3
                + self.wire_ms(factor * (group - 1) / group * nbytes))

    def all_to_all_ms(self, nbytes: float, group: int) -> float:
        """Expert dispatch (or combine) of ``nbytes`` a rank holds: (group-1)/group of it leaves
        the rank, the same share arrives, over each GPU's own link."""
        if group <= 1:
            return 0.0
        return self.eff.collective_latency_us / 1e3 + self.wire_ms((group - 1) / group * nbytes)

    def kernels_ms(self, kernels: int) -> float:
        """GPU time of ``kernels`` small kernels beyond their bytes and FLOPs (fixed each)."""
        return kernels * self.eff.kernel_fixed_us / 1e3

    def host_ms(self, launches: float) -> float:
        return launches * self.eff.launch_overhead_us / 1e3
