"""``dflash-tune estimate``: the performance model asked directly about one configuration.

No study, no config file: the GPU, the model, the parallelism and the speculation are flags;
the answer is the model's prediction at each concurrency level, with the per-component step
breakdown (what the time goes to) on stdout; with ``--format json`` the levels are stdout's only
content and the table goes to stderr. A speculative launch is also priced without speculation,
and its speedup over that is read against the model's error on published speedups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from backends.contract import Measurement, Workload
from backends.deployment import Deployment, DrafterSpec
from backends.flags import LaunchTarget
from backends.launch_params import InvalidParams, LaunchParams
from tuner import render
from tuner.crossover import Crossover, crossover, family_of

# The launch knobs estimate takes: all of them (its own --gpus sets the node's size).
ESTIMATE_KNOBS = tuple(f for f in LaunchParams.__dataclass_fields__)
# What estimate derives when not given: one tensor-parallel group over the node's GPUs, and a
# running cap (and largest graph) that admits the top concurrency level.
ESTIMATE_DERIVED = {"tp_size": "--gpus", "dp_size": "--gpus / --tp-size",
                    "max_running_requests": "the top --concurrency level",
                    "cuda_graph_max_bs": "the top --concurrency level"}


@dataclass(slots=True, frozen=True)
class EstimateRequest:
    gpu: str
    gpus: int
    model: str
    acceptance_length: float
    drafter_layers: int
    input_len: int
    output_len: int
    concurrency: tuple[int, ...]
    knobs: Mapping[str, Any] = field(default_factory=dict)  # given LaunchParams fields
    engine: str = "sglang"  # whose kernel tables and fitted constants price the step
    # Kernel tables instead of the fitted roofline; None: wherever the GPU has them.
    measured_kernels: bool | None = None
    engine_version: str | None = None  # None: the engine's pinned release

    @property
    def measured(self) -> bool:
        from backends.perf_model.shipped import measured_kernels_for

        return measured_kernels_for(self.gpu, self.measured_kernels)

    @property
    def engine_release(self) -> str:
        """The engine release priced: the one asked for, else the pinned one (None only)."""
        from backends.flags import engine_release

        return engine_release(self.engine, self.engine_version)

    def launch(self) -> LaunchParams:
        tp = self.knobs.get("tp_size", self.gpus)
        if self.gpus % tp:
            raise InvalidParams(f"--tp-size {tp} does not divide --gpus {self.gpus}")
        top = max(self.concurrency)
        derived = dict(tp_size=tp, dp_size=self.gpus // tp, max_running_requests=top,
                       cuda_graph_max_bs=top)
        return LaunchParams(**{**derived, **self.knobs})

    def deployment(self) -> Deployment:
        from backends.perf_model.acceptance import profile_for_length

        launch, drafter = self.launch(), None
        if launch.speculative:
            block = launch.speculative_dflash_block_size
            profile = profile_for_length(self.acceptance_length, block)
            drafter = DrafterSpec(block_size=block, num_layers=self.drafter_layers,
                                  target_layers=tuple(range(self.drafter_layers)),
                                  acceptance=profile.top1)
        return Deployment(gpu=self.gpu, gpus=self.gpus, model=self.model, drafter=drafter,
                          engine=self.engine, engine_version=self.engine_version,
                          measured_kernels=self.measured,
                          target=LaunchTarget(model_path="/models/target",
                                              drafter_path="/models/drafter"))


def estimate(req: EstimateRequest) -> list[Measurement]:
    """The model's measurement of each level (a refused launch raises LaunchFailed)."""
    return _measure(req, req.launch())


def plain_estimate(req: EstimateRequest) -> list[Measurement] | None:
    """A speculative launch's levels without speculation (None for a plain launch)."""
    launch = req.launch()
    if not launch.speculative:
        return None
    return _measure(req, replace(launch, speculative_algorithm="none"))


def versus_plain(req: EstimateRequest, rows: Sequence[Measurement],
                 plain: Sequence[Measurement]) -> Crossover:
    """The launch's speedup over its plain twin at each level, within the model's error."""
    from backends.perf_model.shipped import speedup_error

    launch = req.launch()
    curves = {family_of(replace(launch, speculative_algorithm="none")): _rates(plain),
              family_of(launch): _rates(rows)}
    return crossover(curves, margin=speedup_error(req.measured))


def _rates(rows: Sequence[Measurement]) -> dict[int, float]:
    return {m.concurrency: m.output_tok_s for m in rows}


def _measure(req: EstimateRequest, launch: LaunchParams) -> list[Measurement]:
    from backends.perf_model import PerfModelBackend

    backend = PerfModelBackend(req.deployment())
    workload = Workload(req.input_len, req.output_len, req.concurrency)
    rows = backend.measure(launch, workload)
    failed = next((m for m in rows if not m.ok), None)
    if failed is not None:
        raise InvalidParams(f"the model refuses this launch ({failed.failure.value}): "
                         f"{failed.log_excerpt}")
    return rows


def as_json(req: EstimateRequest, rows: Sequence[Measurement],
            plain: Sequence[Measurement] | None = None) -> dict:
    from backends.perf_model.shipped import default_efficiency

    levels = [_level(m) for m in rows]
    for level, twin in zip(levels, plain, strict=True) if plain else ():
        level["plain_output_tok_s"] = twin.output_tok_s
    return {"levels": levels,
            "constants": default_efficiency(req.gpu, req.engine, req.measured).as_dict(),
            "launch": req.launch().label(), "engine": req.engine,
            "engine_version": req.engine_release,
            "speculation_vs_plain": versus_plain(req, rows, plain).as_dict() if plain else None}


def _level(m: Measurement) -> dict:
    return {"concurrency": m.concurrency, "output_tok_s": m.output_tok_s,
            "tpot_p50_ms": m.tpot_p50_ms, "ttft_p50_ms": m.ttft_p50_ms,
            "tok_s_per_user": m.tok_s_per_user, "accept_len_mean": m.accept_len_mean,
            "peak_mem_gib": m.peak_mem_gib, "breakdown_ms": m.breakdown_ms,
            "breakdown_source": m.breakdown_source, "breakdown_sol_pct": m.breakdown_sol_pct}


def show(req: EstimateRequest, rows: Sequence[Measurement],
         plain: Sequence[Measurement] | None = None, console=render.human) -> None:
    columns = ["concurrency", "output tok/s", "TPOT ms", "TTFT ms", "accept"]
    table = [(m.concurrency, f"{m.output_tok_s:,.1f}", f"{m.tpot_p50_ms:.2f}",
              f"{m.ttft_p50_ms:,.0f}", f"{m.accept_len_mean:.2f}") for m in rows]
    if plain:
        columns += ["plain\ntok/s", "vs\nplain"]
        table = [(*row, f"{twin.output_tok_s:,.1f}",
                  f"{m.output_tok_s / twin.output_tok_s:.2f}x")
                 for row, m, twin in zip(table, rows, plain, strict=True)]
    render.table(f"estimate: {req.model} on {req.gpus}x {req.gpu}, {req.launch().label()}, "
                 f"{req.engine} {req.engine_release}", columns, table, console=console)
    if plain:
        render.note("vs plain: the same launch without speculation; "
                    + versus_plain(req, rows, plain).verdict(), console=console)
    render.note("step breakdown, ms per round (where each time comes from: measured kernel "
                "tables, roofline, fitted constant, measured-bf16-kv: attention timed with a "
                "bf16 cache standing in for an 8-bit one; % = share of the hardware's speed of "
                "light):", console=console)
    for m in rows:
        render.note(f"  c={m.concurrency}: " + ", ".join(_part(m, k) for k in m.breakdown_ms),
                    console=console)
    from backends.perf_model.backend import unpriced_knobs

    unknown = unpriced_knobs(req.measured)
    unpriced = sorted(k for k in req.launch().non_default() if k in unknown)
    if unpriced:
        render.note(f"measured only: {', '.join(unpriced)} priced at the engine's defaults "
                    "(the model cannot tell them apart)", "yellow", console=console)


def _part(m: Measurement, name: str) -> str:
    text = f"{name} {m.breakdown_ms[name]:.3f}"
    source = m.breakdown_source.get(name)
    sol = m.breakdown_sol_pct.get(name)
    if source:
        text += f" [{source}" + (f" {sol:.0f}%" if sol is not None else "") + "]"
    return text
