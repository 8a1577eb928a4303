"""Our performance model against NVIDIA AIConfigurator's own estimate, on every published point.

Every point of every source (backends/perf_model/references/*.yaml, the user's node, and
backends/perf_model/validation/*.yaml) is predicted twice: by our model with the shipped
constants (`default_efficiency`, never refitted here) through `model_predictor` / `compare`, and
by AIConfigurator 0.12.0's `aiconfigurator.cli.api.cli_estimate` (mode agg, its newest kernel
tables of the source's engine on the mapped system). Printed: per point the observed value, ours
and AIConfigurator's with their errors, then how often our absolute error is the smaller one and
each one's median absolute error.

    pip install -e '.[aiconfigurator]'    # once (Python >= 3.11)
    python bench/model_vs_aiconfigurator.py [--json OUT] [--measured-kernels]

``--measured-kernels`` prices our side from the GPUs' measured kernel tables (the same tables
AIConfigurator reads) instead of the fitted roofline.

How a point becomes a cli_estimate call:
- isl / osl are the source's workload lengths; batch_size is the concurrency level, capped at the
  launch's max_running_requests (a closed loop of more clients runs that many, the rest queue).
  tp_size is the launch's; moe_ep_size its ep_size and moe_tp_size tp_size / ep_size (SGLang's
  --tp 8 --ep 4 shards each expert over 2 ranks of 4 groups; vLLM's --enable-expert-parallel is
  ep_size = tp_size).
- An 8-bit KV cache (the launch's kv_cache_dtype) is its kvcache_quant_mode fp8; otherwise it
  infers the cache type from the model, as it does by default.
- Output throughput is the estimate's "tokens/s": the whole replica's output (its "tokens/s/gpu"
  is that over tp x pp x dp GPUs), in the unit of our observations (a deployment's output tok/s).
  It counts osl - 1 tokens a request (the first comes with the prefill): under 0.4% here.
  TPOT and TTFT (ms) are its `tpot` and `ttft`; a speedup is the ratio of two estimates.
- `at: peak` (the best over the workload's levels) is each level estimated and the best taken,
  as `compare` does on our side; a level AIConfigurator declares out of memory is left out of
  that best (as our side leaves out a level it predicts fails). A level whose batch it says
  exceeds its KV cache (it then calls its TPOT inaccurate) still counts, with a note.
- DFlash: AIConfigurator models speculation as MTP only. Its step verifies `nextn` + 1 tokens a
  request, adds `nextn` layers' worth of draft work (`mtp_scale_factor`), and advances
  1 + `nextn_accepted` tokens a step (aiconfigurator/sdk/speculative.py: nextn_accepted is the
  mean accepted *draft* tokens a step, 0 <= it <= nextn). So nextn = block size - 1 (the draft
  tokens a DFlash round verifies besides the anchor) and nextn_accepted = the mean accepted
  length our model uses for the point (the source's accept length, which counts the bonus
  token, through the drafter's acceptance profile) minus 1. Both tools get the same acceptance;
  what differs is the step's cost (AIConfigurator prices the drafter as nextn target layers run
  one after another, DFlash runs its few layers once over the block; a chain drafter such as
  EAGLE-3 runs its one layer once a draft token, the sequence MTP describes). DDTree (no
  source has a point yet): nextn = the node budget (the tokens the tree verifies),
  nextn_accepted the tree's mean accepted length minus 1; its tree mask is not modelled, so
  such points are approximate.
  Kimi-K3 is the exception: with nextn > 0 its Kimi-K3 model prices a 5-layer DSpark drafter
  of its own and the KDA verify kernels (the K3 sources' drafters are DSpark).

Points AIConfigurator cannot express exactly are still estimated with the nearest call and
marked, and left out of the main summary (a second summary line counts them too):
- eager mode (cuda_graph false): it has no eager mode; its estimate is the graph-mode one;
- a GPU it has no system for but a sibling of (rtx-pro-6000-workstation, 1,792 GB/s): the
  server edition's tables (rtx_pro_6000_server, 1,597 GB/s);
- DDTree (above).
Points it cannot express at all (a model it bundles no config of, an engine or a parallelism
this script does not map) and points it estimates out of memory are listed with the reason.

Nothing is downloaded: every model maps to a config in aiconfigurator_core/model_configs, and the
hub loaders are replaced by a function that raises. Kimi-K2-Instruct's config is bundled but not
in AIConfigurator's registry of bundled models (which would send it to the hub), so it is read
from a temporary folder holding that file as config.json, removed when the script ends.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import Timer, arguments, host_line, save_json, table  # noqa: E402

from backends.deployment import Deployment  # noqa: E402
from backends.launch_params import LaunchParams  # noqa: E402
from backends.perf_model.acceptance import (  # noqa: E402
    DrafterProfile,
    chain_acceptance,
    tree_acceptance,
)
from backends.perf_model.calibrate import (  # noqa: E402
    PEAK, PEAK_SECOND, SPEEDUP, Observation, compare)
from backends.perf_model.constants import KV_TABLE_DTYPE  # noqa: E402
from backends.perf_model.references import Reference, model_predictor  # noqa: E402
from backends.perf_model.references import validation_sources  # noqa: E402
from backends.perf_model.shipped import default_efficiency  # noqa: E402

# Our catalog name -> the AIConfigurator model config it is estimated with (all bundled).
MODELS = {
    # Kimi K2.6 is bundled only as NVIDIA's NVFP4 repack; K2.5 has the same text architecture
    # (DeepSeek-V3 layout, 61 layers, 384 experts, top-8) and the same INT4 (W4A16) routed
    # experts our kimi-k2.6 entry describes.
    "kimi-k2.6": "moonshotai/Kimi-K2.5",
    # FP8 block weights as in our entry; bundled but outside the registry (see the docstring).
    "kimi-k2-instruct": "moonshotai/Kimi-K2-Instruct",
    # Our entry is the DeepSeek-V3 architecture with FP8 block weights; the sources ran
    # DeepSeek-R1-0528, which is that architecture: R1's config.
    "deepseek-v3-fp8": "deepseek-ai/DeepSeek-R1",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",  # bf16, as in the source
    # The base model's config: the Instruct model the sources ran has the same architecture.
    "llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B",
    "kimi-k3": "moonshotai/Kimi-K3",  # the config our entry was read from
    "gpt-oss-120b": "openai/gpt-oss-120b",
}
# Our GPU name -> AIConfigurator's system (every one an 8-GPU node of that GPU).
SYSTEMS = {
    "rtx-pro-6000-server": "rtx_pro_6000_server",
    "h100-sxm": "h100_sxm",
    "h200-sxm": "h200_sxm",
    "b200-sxm": "b200_sxm",
    "b300-sxm": "b300_sxm",
}
# GPUs it has no system for, estimated on a sibling's tables (marked approximate).
PROXY_SYSTEMS = {
    "rtx-pro-6000-workstation": ("rtx_pro_6000_server",
                                 "no workstation system: the server edition's tables "
                                 "(1,597 vs 1,792 GB/s)"),
}
ENGINES = ("sglang", "vllm")  # AIConfigurator's backend names are ours


class NotExpressible(Exception):
    """A point AIConfigurator has no way to estimate (the reason is the message)."""


@dataclass(slots=True)
class Row:
    source: str
    point: str
    metric: str
    observed: float
    ours: float | None = None
    theirs: float | None = None
    approximate: list[str] = field(default_factory=list)  # why AIC's call is only the nearest
    notes: list[str] = field(default_factory=list)
    skipped: str = ""  # why AIC gave no number

    @property
    def ours_error(self) -> float | None:
        return _error(self.ours, self.observed)

    @property
    def theirs_error(self) -> float | None:
        return _error(self.theirs, self.observed)

    @property
    def exact(self) -> bool:
        return self.theirs is not None and not self.approximate


def _error(predicted: float | None, observed: float) -> float | None:
    if predicted is None or not observed:
        return None
    return predicted / observed - 1.0


@dataclass(slots=True, frozen=True)
class Call:
    """One cli_estimate call, hashable so repeated levels are estimated once."""

    model: str
    system: str
    engine: str
    isl: int
    osl: int
    batch: int
    tp: int
    moe_tp: int
    moe_ep: int
    nextn: int = 0
    accepted: float | None = None
    kv_cache: str | None = None  # its KV cache quantisation (None: inferred from the model)


@dataclass(slots=True, frozen=True)
class Estimate:
    tokens_s: float = 0.0
    tpot_ms: float = 0.0
    ttft_ms: float = 0.0
    kv_over: bool = False  # it warned the batch exceeds its KV cache
    failure: str = ""  # out of memory, or another refusal

    def metric(self, name: str) -> float:
        return {"output_tok_s": self.tokens_s, "tpot_p50_ms": self.tpot_ms,
                "ttft_p50_ms": self.ttft_ms}[name]


class AIConfigurator:
    """cli_estimate behind a cache, with the hub loaders disabled."""

    def __init__(self, configs: Path) -> None:
        from aiconfigurator.cli import api
        from aiconfigurator_core.sdk import common, memory, utils

        def refuse(hf_id: str, *args, **kwargs):
            raise RuntimeError(f"refused to download {hf_id}'s config: this benchmark is offline")

        for module in (utils, memory):
            for name in ("_download_hf_json", "_download_hf_config"):
                if hasattr(module, name):
                    setattr(module, name, refuse)
        self._api, self._bundled, self._configs = api, common.DefaultHFModels, configs
        self._cache: dict[Call, Estimate] = {}
        self.calls = 0

    def model_path(self, hf_id: str) -> str:
        """The id itself when AIConfigurator's registry has it; else a folder holding the
        bundled config file as config.json; NotExpressible when it bundles none."""
        if hf_id in self._bundled:
            return hf_id
        from aiconfigurator_core.sdk.utils import _get_model_config_path

        bundled = Path(str(_get_model_config_path())) / f"{hf_id.replace('/', '--')}_config.json"
        if not bundled.is_file():
            raise NotExpressible(f"AIConfigurator bundles no config of {hf_id}")
        folder = self._configs / hf_id.replace("/", "--")
        folder.mkdir(exist_ok=True)
        shutil.copyfile(bundled, folder / "config.json")
        return str(folder)

    def estimate(self, call: Call) -> Estimate:
        if call not in self._cache:
            self._cache[call] = self._run(call)
        return self._cache[call]

    def _run(self, c: Call) -> Estimate:
        self.calls += 1
        try:
            r = self._api.cli_estimate(
                c.model, c.system, mode="agg", backend_name=c.engine, isl=c.isl, osl=c.osl,
                batch_size=c.batch, tp_size=c.tp, moe_tp_size=c.moe_tp, moe_ep_size=c.moe_ep,
                nextn=c.nextn, nextn_accepted=c.accepted, kvcache_quant_mode=c.kv_cache)
        except RuntimeError as err:  # its OOM verdict, or a refusal
            text = str(err)
            return Estimate(failure="out of memory" if text.startswith("OOM") else text[:120])
        return Estimate(float(r.raw["tokens/s"]), float(r.tpot), float(r.ttft),
                        kv_over=bool(r.kv_cache_warning))


def mapped_call(aic: AIConfigurator, src: Reference, launch: LaunchParams, level: int
                ) -> tuple[Call, list[str]]:
    """The cli_estimate call of ``launch`` at one level, and what makes it approximate."""
    d: Deployment = src.deployment
    approx = []
    if d.model not in MODELS:
        raise NotExpressible(f"model {d.model} has no AIConfigurator config mapped")
    if d.gpu in SYSTEMS:
        system = SYSTEMS[d.gpu]
    elif d.gpu in PROXY_SYSTEMS:
        system, why = PROXY_SYSTEMS[d.gpu]
        approx.append(why)
    else:
        raise NotExpressible(f"AIConfigurator has no system for {d.gpu}")
    if d.engine not in ENGINES:
        raise NotExpressible(f"engine {d.engine} is not one of AIConfigurator's {ENGINES}")
    if launch.dp_size != 1 or launch.enable_dp_attention:
        raise NotExpressible("data-parallel replicas / DP attention are not mapped here")
    if not launch.cuda_graph:
        approx.append("eager: AIConfigurator has no eager mode (its estimate assumes graphs)")
    nextn, accepted = 0, None
    if launch.speculative:
        profile = DrafterProfile(d.drafter.acceptance, d.drafter.rank_decay)
        if launch.is_ddtree:
            approx.append("DDTree: estimated as an MTP chain of budget tokens (no tree mask)")
            nextn = launch.speculative_ddtree_budget
            mean = tree_acceptance(profile, nextn, launch.tree_width, launch.tree_depth).mean
        else:
            nextn = launch.speculative_dflash_block_size - 1
            mean = chain_acceptance(profile, launch.speculative_dflash_block_size).mean
        accepted = round(min(max(mean - 1.0, 0.0), nextn), 4)
    call = Call(aic.model_path(MODELS[d.model]), system, d.engine, src.workload.input_len,
                src.workload.output_len, min(level, launch.max_running_requests),
                launch.tp_size, launch.tp_size // launch.ep_size, launch.ep_size, nextn, accepted,
                None if launch.kv_cache_dtype == "auto" else KV_TABLE_DTYPE[launch.kv_cache_dtype])
    return call, approx


def theirs(aic: AIConfigurator, src: Reference, obs: Observation, row: Row) -> None:
    """AIConfigurator's value of one observation, into ``row`` (or why there is none)."""
    levels = src.workload.concurrency if obs.at == PEAK else (obs.at,)
    metric = "output_tok_s" if obs.metric == SPEEDUP else obs.metric
    best, left_out = None, []
    for level in levels:
        launches = (obs.launch,) if obs.baseline is None else (obs.launch, obs.baseline)
        values, notes = [], []
        for launch in launches:
            call, approx = mapped_call(aic, src, launch, level)
            value, note = _value(aic, call, metric)
            values.append(value)
            notes += [note] if note else []
            row.approximate = sorted(set(row.approximate) | set(approx))
        if None in values or not values[-1]:
            left_out.append(f"c{level}: {'; '.join(notes)}")
            continue
        value = values[0] / values[1] if obs.baseline is not None else values[0]
        best = value if best is None else max(best, value)
        row.notes += [f"c{level}: {n}" for n in notes]
    row.theirs = best
    if best is None:
        row.skipped = "; ".join(left_out)
    elif left_out:
        row.notes.append("left out of the peak: " + ", ".join(left_out))


def _value(aic: AIConfigurator, call: Call, metric: str) -> tuple[float | None, str]:
    """A metric of one call and a note, or None and why there is none."""
    est = aic.estimate(call)
    if est.failure:
        return None, est.failure
    # Its TPOT is the decode step alone: the batch's output rate in a second with no prefill.
    value = call.batch * 1e3 / est.tpot_ms if metric == PEAK_SECOND else est.metric(metric)
    return value, "batch over its KV cache (TPOT inaccurate, it says)" * est.kv_over


def rows_of(aic: AIConfigurator, src: Reference) -> list[Row]:
    d = src.deployment
    ours = compare(model_predictor(d), default_efficiency(d.gpu, d.engine, d.measured_kernels), src.observations,
                   src.workload)
    rows = []
    for obs, mine in zip(src.observations, ours, strict=True):
        row = Row(src.name, obs.name, obs.metric, obs.value, ours=mine.predicted or None)
        try:
            theirs(aic, src, obs, row)
        except NotExpressible as err:
            row.skipped = str(err)
        rows.append(row)
    return rows


def summary(rows: list[Row]) -> dict:
    both = [r for r in rows if r.theirs is not None and r.ours is not None]
    ours_better = sum(abs(r.ours_error) < abs(r.theirs_error) for r in both)
    return {"points": len(both), "ours_better": ours_better,
            "ours_median_abs_error": _median([abs(r.ours_error) for r in both]),
            "aiconfigurator_median_abs_error": _median([abs(r.theirs_error) for r in both])}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _cell(value: float | None, error: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g} ({error:+.0%})" if error is not None else f"{value:.4g}"


def print_report(rows: list[Row]) -> tuple[dict, dict]:
    marks = {}  # reason -> footnote number
    body = []
    for r in rows:
        tags = "".join(f"[{marks.setdefault(a, len(marks) + 1)}]" for a in r.approximate)
        body.append((r.source, r.point + tags, r.metric, f"{r.observed:.4g}",
                     _cell(r.ours, r.ours_error),
                     _cell(r.theirs, r.theirs_error) if r.theirs is not None else "n/a"))
    print(table(("source", "point", "metric", "observed", "ours (error)",
                 "AIConfigurator (error)"), body))
    if marks:
        print("\napproximate (AIConfigurator's nearest call; not in the main summary):")
        for reason, n in marks.items():
            print(f"  [{n}] {reason}")
    skipped = [r for r in rows if r.theirs is None]
    if skipped:
        print("\nno AIConfigurator number:")
        for r in skipped:
            print(f"  {r.source}: {r.point}: {r.skipped}")
    noted = [r for r in rows if r.notes]
    if noted:
        print("\nnotes:")
        for r in noted:
            print(f"  {r.source}: {r.point}: {'; '.join(r.notes)}")
    exact = summary([r for r in rows if r.exact])
    every = summary([r for r in rows if r.theirs is not None])
    print("\nsummary (absolute error of the prediction against the published value)")
    for label, s in (("points AIConfigurator expresses exactly", exact),
                     ("with the approximate ones", every)):
        if not s["points"]:
            print(f"  {label}: none")
            continue
        print(f"  {label}: {s['points']}; ours closer on {s['ours_better']}, "
              f"AIConfigurator on {s['points'] - s['ours_better']}; median absolute error "
              f"ours {s['ours_median_abs_error']:.1%}, AIConfigurator "
              f"{s['aiconfigurator_median_abs_error']:.1%}")
    return exact, every


@contextlib.contextmanager
def quiet_aiconfigurator() -> Iterator[None]:
    """Its info lines (table loads, fallback rows) would bury the table."""
    loggers = [logging.getLogger(n) for n in ("aiconfigurator", "aiconfigurator_core")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--measured-kernels", action="store_true",
                        help="price our side from the measured kernel tables")
    args = parser.parse_args(argv)
    timer = Timer()
    sources = validation_sources()
    if args.measured_kernels:
        sources = [replace(s, deployment=replace(s.deployment, measured_kernels=True))
                   for s in sources]
    with tempfile.TemporaryDirectory(prefix="model_vs_aic_") as configs, quiet_aiconfigurator():
        aic = AIConfigurator(Path(configs))
        rows = [row for src in sources for row in rows_of(aic, src)]
    exact, every = print_report(rows)
    print(f"\n{aic.calls} cli_estimate calls, {timer.s:.0f} s")
    print(host_line(), file=sys.stderr)
    save_json(args.json, {
        "aiconfigurator": _version("aiconfigurator"),
        "summary_exact": exact, "summary_with_approximate": every,
        "points": [{"source": r.source, "point": r.point, "metric": r.metric,
                    "observed": r.observed, "ours": r.ours, "aiconfigurator": r.theirs,
                    "approximate": r.approximate, "notes": r.notes, "skipped": r.skipped}
                   for r in rows]})
    return 0


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    sys.exit(main())
