"""Measured kernel latencies of one GPU system under one serving engine.

The tables are NVIDIA AIConfigurator's silicon measurements (the ``aiconfigurator-core``
package, Apache-2.0): per system (``rtx_pro_6000_server``, ``h200_sxm``, ...), per kernel family
(gemm, moe, mla, mla_bmm, attention, comm) and per engine and engine version, parquet files of
latencies in milliseconds. This module reads them and interpolates on their grids
(``grid.Grid``); every lookup answers None where no table covers the shape, and the caller
falls back to the roofline.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from backends.perf_model.kernels.grid import Grid

NCCL = "nccl"
BF16 = "bfloat16"  # the tables' name of the KV cache's and attention's 16-bit element type


@cache
def data_root() -> Path | None:
    """The installed tables, or None when the package is missing."""
    try:
        root = resources.files("aiconfigurator_core") / "systems" / "data"
    except ModuleNotFoundError:
        return None
    path = Path(str(root))
    return path if path.is_dir() else None


@cache
def table_path(system: str, family: str, engine: str, file: str) -> Path | None:
    """``data/<system>/<family>/<engine>/<newest version>/<file>``, or None."""
    root = data_root()
    if root is None:
        return None
    folder = root / system / family / engine
    versions = sorted((p for p in folder.glob("*") if (p / file).is_file()),
                      key=lambda p: _version_key(p.name))
    return versions[-1] / file if versions else None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


@dataclass(slots=True, frozen=True)
class Contradicted:
    """Rows the model leaves out: those of ``file`` under ``engine`` whose ``column`` is
    ``value``, on ``system`` (None: every system), each contradicted by measurements of the
    engine. Lookups of them answer None, as for a shape no table covers."""

    engine: str
    file: str
    column: str
    value: str
    why: str
    system: str | None = None

    def covers(self, system: str, engine: str, file: str, where: dict[str, object]) -> bool:
        return ((self.system is None or self.system == system) and self.engine == engine
                and self.file == file and where.get(self.column) == self.value)


CONTRADICTED = (
    Contradicted(
        "vllm", "mla_generation_module_perf.parquet", "kv_cache_dtype", "fp8",
        "vLLM's MLA decode block with an FP8 cache is timed at 10-17x its bf16 time, while "
        "vLLM on 8x RTX PRO 6000 decoded Kimi K2.5 as fast with an FP8 cache as with bf16 "
        "(Triton MLA, 79 and 78 tok/s: local-inference-lab/rtx6kpro benchmarks/results.md)",
        system="rtx_pro_6000_server"),
    Contradicted(
        "vllm", "gemm_perf.parquet", "gemm_dtype", "fp8_block",
        "vLLM's block-scaled FP8 GEMMs are timed with a floor the shape does not move (the "
        "median one-row GEMM up to 1,024 x 1,024: 60-61 us on the H100 and H200, 170-575 us on "
        "the RTX PRO 6000, L40S and Blackwell systems), where SGLang's FP8 rows of the same "
        "GPUs time 4-7 us; vLLM's own MLA-block rows, "
        "three such GEMMs each, are as fast with them as with bf16; and DeepSeek-R1 FP8 on "
        "8x H200 under vLLM decodes a token in 15.85 ms (vllm-project/recipes "
        "DeepSeek-V3.md), under the 20 ms and more its ~360 dense GEMMs a step would take at the "
        "H200's floor alone"),
)


def contradicted(system: str, engine: str, file: str,
                 where: dict[str, object]) -> Contradicted | None:
    return next((c for c in CONTRADICTED if c.covers(system, engine, file, where)), None)


@cache
def _columns(path: Path) -> dict[str, np.ndarray]:
    table = pq.read_table(path)
    return {name: table.column(name).to_numpy(zero_copy_only=False)
            for name in table.column_names}


@cache
def rows_grid(path: Path, where: tuple[tuple[str, object], ...],
              axes: tuple[str, ...], dropped: tuple[float, ...] = ()) -> Grid | None:
    """The grid over ``axes`` of the rows of ``path`` whose columns equal ``where``, less those
    whose first axis is one of ``dropped`` (otherwise every row of the file: CONTRADICTED is
    the lookups' to apply)."""
    cols = _columns(path)
    keep = ~np.isin(cols[axes[0]].astype(float), dropped)
    for column, value in where:
        keep &= cols[column] == value
    if not keep.any():
        return None
    points = np.stack([cols[a][keep].astype(float) for a in axes], axis=1)
    return Grid.from_rows(points, cols["latency"][keep].astype(float))


@cache
def _warm_token_counts(system: str, engine: str, where: tuple[tuple[str, object], ...],
                       cold_ms: Callable[[float], float]) -> tuple[float, ...]:
    """The token counts of the MoE rows ``where`` whose balanced row beats ``cold_ms``."""
    path = table_path(system, "moe", engine, "moe_perf.parquet")
    balanced = None if path is None else rows_grid(
        path, tuple(sorted((*where, ("distribution", "balanced")))), ("num_tokens",))
    if balanced is None:
        return ()
    return tuple(float(n) for n, ms in zip(balanced.axes[0], balanced.latency_ms, strict=True)
                 if ms < cold_ms(float(n)))


@dataclass(slots=True, frozen=True)
class KernelTables:
    """Lookups for one system and engine family (``sglang`` or ``vllm``)."""

    system: str
    engine: str

    def _at(self, family: str, file: str, where: dict[str, object], axes: tuple[str, ...],
            point: tuple[float, ...], engine: str | None = None,
            held: tuple[int, ...] = (), dropped: tuple[float, ...] = ()) -> float | None:
        engine = engine or self.engine
        path = table_path(self.system, family, engine, file)
        if path is None or contradicted(self.system, engine, file, where):
            return None
        grid = rows_grid(path, tuple(sorted(where.items())), axes, dropped)
        return grid.at(point, held) if grid is not None else None

    def gemm_ms(self, m: int, n: int, k: int, dtype: str) -> float | None:
        """One ``m x k`` by ``k x n`` GEMM (dtype: bfloat16, fp8, fp8_block, nvfp4)."""
        return self._at("gemm", "gemm_perf.parquet", {"gemm_dtype": dtype}, ("m", "n", "k"),
                        (m, n, k))

    def moe_ms(self, tokens: int, hidden: int, inter: int, top_k: int, experts: int,
               moe_tp: int, moe_ep: int, dtype: str, distribution: str,
               cold_ms: Callable[[float], float] | None = None) -> float | None:
        """One MoE layer's expert GEMMs for ``tokens`` tokens on the slowest rank (routing,
        permutation and the grouped GEMMs; dispatch between ranks is not in it).

        ``cold_ms(n)``: the least time ``n`` tokens' experts under balanced routing take to
        stream from memory (0 where they would not fit in the L2 cache). A token count whose
        balanced row beats it ran with its experts still in the L2 from the benchmark's
        previous run, which a step streaming every layer's experts never has: its rows are
        left out, so the lookup interpolates between the counts around it."""
        where = {"moe_dtype": dtype, "hidden_size": hidden, "inter_size": inter,
                 "topk": top_k, "num_experts": experts, "moe_tp_size": moe_tp,
                 "moe_ep_size": moe_ep}
        warm = () if cold_ms is None else _warm_token_counts(
            self.system, self.engine, tuple(sorted(where.items())), cold_ms)
        return self._at("moe", "moe_perf.parquet", {**where, "distribution": distribution},
                        ("num_tokens",), (tokens,), dropped=warm)

    def kda_ms(self, phase: str, kernels: tuple[str, ...], batch: int, tokens: int,
               heads: int) -> float | None:
        """One KDA linear-attention layer on one rank holding ``heads`` heads: the sum of
        ``kernels`` (convolution, recurrence; each timed alone) for ``batch`` requests of
        ``tokens`` tokens each, in ``phase`` (``generation``: one token; ``verify``: a few;
        ``context``: a prompt)."""
        axes, point = (("batch_size",), (batch,)) if phase == "generation" else (
            ("batch_size", "seq_len"), (batch, tokens))
        total = 0.0
        for kernel in kernels:
            where = {"kernel_source": kernel, "phase": phase, "num_k_heads": heads}
            ms = self._at("kda", "kda_perf.parquet", where, axes, point)
            if ms is None:
                return None
            total += ms
        return total

    def mla_module_ms(self, batch: int, heads: int, length: float, gemm_dtype: str,
                      prompt: bool = False, kv_dtype: str = BF16) -> float | None:
        """vLLM's whole MLA block of one layer on one rank holding ``heads`` heads (its q and
        kv down projections, q up projection, absorbed attention and output projection, in
        ``gemm_dtype``), DeepSeek-V3's shape: ``batch`` single-token queries over ``length``
        tokens cached in ``kv_dtype`` (bfloat16, fp8) each, or with ``prompt`` ``batch`` whole
        prompts of ``length`` tokens (FlashAttention's prefill)."""
        where = {"kv_cache_dtype": kv_dtype, "gemm_type": gemm_dtype,
                 "model": "deepseek-ai/DeepSeek-V3"}
        if prompt:
            where["kernel_source"] = "FLASH_ATTN"
        family, axis = ("context", "isl") if prompt else ("generation", "step")
        return self._at("mla", f"mla_{family}_module_perf.parquet", where,
                        ("num_heads", "batch_size", axis), (heads, batch, length))

    def mla_generation_ms(self, batch: int, heads: int, context: float,
                          kv_dtype: str = BF16) -> float | None:
        """Absorbed MLA decode attention of one layer on one rank: ``batch`` queries of
        ``heads`` heads (the rank's share) against ``context`` tokens cached in ``kv_dtype``."""
        return self._at("mla", "generation_mla_perf.parquet", {"kv_cache_dtype": kv_dtype},
                        ("num_heads", "batch_size", "step"), (heads, batch, context))

    def mla_context_ms(self, batch: int, heads: int, prompt: int,
                       kv_dtype: str = BF16) -> float | None:
        """MLA prompt attention of one layer on one rank: ``batch`` prompts of ``prompt``
        tokens each (causal, no cached prefix), ``heads`` heads (the rank's share)."""
        return self._at("mla", "context_mla_perf.parquet", {"kv_cache_dtype": kv_dtype},
                        ("num_heads", "batch_size", "isl"), (heads, batch, prompt))

    def attention_context_ms(self, batch: int, heads: int, kv_heads: int, head_dim: int,
                             prompt: int, kv_dtype: str = BF16) -> float | None:
        """GQA prompt attention of one layer on one rank (causal, no cached prefix)."""
        where = {"head_dim": head_dim, "num_key_value_heads": kv_heads,
                 "kv_cache_dtype": kv_dtype, "attn_dtype": BF16, "window_size": 0}
        return self._at("attention", "context_attention_perf.parquet", where,
                        ("num_heads", "batch_size", "isl"), (heads, batch, prompt))

    def mla_bmm_ms(self, op: str, tokens: int, heads: int, dtype: str) -> float | None:
        """The absorbed MLA's per-head batched GEMMs (``mla_gen_pre``: q into the latent,
        ``mla_gen_post``: the latent out to values) for ``heads`` heads of one rank."""
        return self._at("mla_bmm", "mla_bmm_perf.parquet", {"op_name": op, "bmm_dtype": dtype},
                        ("num_tokens", "num_heads"), (tokens, heads))

    def attention_generation_ms(self, batch: int, heads: int, kv_heads: int, head_dim: int,
                                context: float, kv_dtype: str = BF16) -> float | None:
        """GQA decode attention of one layer on one rank: ``batch`` single-token queries of
        ``heads`` heads over ``kv_heads`` KV heads, ``context`` tokens cached in ``kv_dtype``
        each. Query heads past the widest timed hold its time: the kernel folds a KV head's
        query heads into the rows of one tile that reads that head's cache once, so more of
        them add FLOPs (the caller's to bound), not reads."""
        where = {"head_dim": head_dim, "num_key_value_heads": kv_heads,
                 "kv_cache_dtype": kv_dtype, "window_size": 0}
        return self._at("attention", "generation_attention_perf.parquet", where,
                        ("num_heads", "batch_size", "step"), (heads, batch, context), held=(0,))

    def collective_ms(self, op: str, elements: float, gpus: int) -> float | None:
        """NCCL ``op`` (all_reduce, all_gather, reduce_scatter, alltoall) of ``elements``
        16-bit elements over ``gpus`` GPUs."""
        return self._at("comm", "nccl_perf.parquet", {"op_name": op, "nccl_dtype": "half",
                                                      "num_gpus": gpus},
                        ("message_size",), (elements,), engine=NCCL)

    def custom_all_reduce_ms(self, elements: float, gpus: int, graph: bool) -> float | None:
        """The engine's own one-shot / two-shot all-reduce (eager or inside a CUDA graph)."""
        backend = f"{self.engine}_{'graph' if graph else 'eager'}"
        return self._at("comm", "custom_allreduce_perf.parquet",
                        {"backend": backend, "num_gpus": gpus}, ("message_size",), (elements,))


def tables_for(system: str, engine: str) -> KernelTables | None:
    """The tables of ``system`` (hardware.yaml ``measured_system``) under ``engine``'s family
    (SGLang or vLLM; dflash_core's own engine runs SGLang-style kernels), or None."""
    root = data_root()
    if not system or root is None or not (root / system).is_dir():
        return None
    return KernelTables(system, "vllm" if engine.lower().startswith("vllm") else "sglang")
