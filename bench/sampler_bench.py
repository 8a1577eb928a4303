"""Does the tuner's sampler find the optimum quickly? TPE vs random search on the shipped space.

The scalar is output tok/s at ``workload.target_concurrency`` of a configuration that succeeded
and meets the SLA there (``workload.limits``); anything else scores 0. Everything uses the
built-in defaults (``Config()``: space ``pcie8_kimi``, model backend, reference node).

1. Grid optimum: every point of ``space.grid(context, max_points)`` measured with the model
   backend at concurrency 1 and the target only, split over 2 processes; the max of the scalar.
2. Sampler runs: for each sampler and seed, ``tuner.runner.run_study`` (the real objective path)
   into a fresh temp SQLite DB; the best feasible scalar among the first k trials, read back
   from our records, over the grid optimum (> 1 is possible: TPE samples between grid points).

Rows named ``sampler/variant`` are bench-only: a sampler setting or an edited copy of the space
(in the temp dir) to show what would help; the ratio stays over the shipped grid optimum.

Criterion: TPE's median over seeds at 40 trials >= 0.98. Exit code 0 always (a measurement).

    python bench/sampler_bench.py [--seeds 5] [--trials 40] [--max-points 8] [--json OUT]
"""

from __future__ import annotations

import multiprocessing
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import islice
from pathlib import Path

import optuna
import yaml
from harness import Timer, arguments, host_line, save_json, stat

from backends import Workload
from tuner.params import parse
from search_spaces import load_space
from search_spaces.loader import SHIPPED
from tuner import records
from tuner import study as study_mod
from tuner.config import Config
from tuner.config import StudyConfig
from tuner.config import TuningConfig
from tuner.runner import run_study
from tuner.selection import candidates
from tuner.wiring import backend_from
from tuner.wiring import space_context

CRITERION = 0.98
PROCESSES = 2


@dataclass(slots=True, frozen=True)
class Variant:
    """One row: a Config sampler name, optionally a bench-only sampler or space edit."""

    sampler: str
    note: str = ""  # what a bench-only row changes
    factory: Callable[..., optuna.samplers.BaseSampler] | None = None  # called with seed=
    edit_space: Callable[[dict], None] | None = None


def _prune(raw: dict) -> None:
    raw["params"]["tp_size"]["choices"] = [8]
    raw["params"]["enable_dp_attention"]["choices"] = [False]


PRUNED = "space without TP4 and attention-DP (always OOM on this node)"
VARIANTS: dict[str, Variant] = {
    "tpe": Variant("tpe"),
    "random": Variant("random"),
    "tpe/startup20": Variant("tpe", "the tuner's TPE with n_startup_trials=20 (not 10)",
                             factory=partial(optuna.samplers.TPESampler, multivariate=True,
                                             group=True, constant_liar=False,
                                             n_startup_trials=20)),
    "tpe/pruned": Variant("tpe", PRUNED, edit_space=_prune),
    "random/pruned": Variant("random", PRUNED, edit_space=_prune),
}


def scalar(by_level: dict, cfg: Config) -> float:
    """Output tok/s at the target if the configuration succeeded and meets the SLA, else 0."""
    m = by_level.get(cfg.workload.target_concurrency)
    if m is None or m.failure or any(lim.violation(getattr(m, lim.metric)) > 0
                                     for lim in cfg.workload.limits):
        return 0.0
    return m.output_tok_s


def _grid_shard(args: tuple[int, int, int]) -> tuple[int, float, dict | None]:
    """Every ``n``-th grid point from ``k``: (points seen, best scalar, its params)."""
    k, n, max_points = args
    cfg = Config()
    space, backend = load_space(cfg.search_space), backend_from(cfg)
    w = cfg.workload
    workload = Workload(w.input_len, w.output_len, (1, w.target_concurrency))
    count, best, best_params = 0, 0.0, None
    for params in islice(space.grid(space_context(cfg), max_points), k, None, n):
        count += 1
        launch, _ = parse(params)
        rows = backend.measure(launch, workload) if launch else []
        value = scalar({m.concurrency: m for m in rows}, cfg)
        if value > best:
            best, best_params = value, params
    return count, best, best_params


def grid_optimum(max_points: int) -> dict:
    timer = Timer()
    with multiprocessing.get_context("fork").Pool(PROCESSES) as pool:
        shards = pool.map(_grid_shard, [(k, PROCESSES, max_points) for k in range(PROCESSES)])
    _, best, params = max(shards, key=lambda s: s[1])
    levels = (1, Config().workload.target_concurrency)
    return {"max_points_per_param": max_points, "size": sum(s[0] for s in shards), "levels": levels,
            "optimum": best, "params": params, "seconds": timer.s}


def run_one(label: str, seed: int, trials: int, tmp: str) -> list[records.TrialRecord]:
    variant = VARIANTS[label]
    tag = f"{list(VARIANTS).index(label)}-{seed}"  # a fresh DB and study per run
    study = StudyConfig(name=f"bench-{tag}", sampler=variant.sampler, seed=seed,
                        storage=f"sqlite:///{tmp}/{tag}.db", n_trials=trials)
    # The sampler alone: no level walks after its trials.
    cfg = Config(study=study, search_space=_space_file(variant, tmp),
                 tuning=TuningConfig(level_search=False))
    original = study_mod.make_sampler
    if variant.factory is not None:  # open_study looks make_sampler up at call time
        study_mod.make_sampler = lambda _name, s: variant.factory(seed=s)
    try:
        run_study(cfg)
    finally:
        study_mod.make_sampler = original
    return records.load_trials(records.connect(study.storage), study.name)


def _space_file(variant: Variant, tmp: str) -> str:
    if variant.edit_space is None:
        return Config().search_space
    raw = yaml.safe_load((SHIPPED / f"{Config().search_space}.yaml").read_text())
    variant.edit_space(raw)
    path = Path(tmp) / f"{variant.edit_space.__name__}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def best_within(trials: list[records.TrialRecord], k: int, cfg: Config) -> tuple[float, dict]:
    """Best among the first ``k`` measured trials (rejected samples never reach a backend)."""
    measured = [t for t in trials if t.measured][:k]
    cands = candidates(measured,
                       cfg.workload.target_concurrency, cfg.workload.limits)
    top = max(cands, key=lambda c: c.throughput, default=None)
    return (top.throughput, top.trial.params) if top else (0.0, {})


def sampler_runs(label: str, seeds: int, trials: int, optimum: float) -> dict:
    cfg, ks = Config(), sorted({k for k in (10, 20, 30, 40) if k < trials} | {trials})
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run_one(label, seed, trials, tmp) for seed in range(seeds)]
    per_seed = []
    for seed, rows in enumerate(runs):
        best, params = best_within(rows, trials, cfg)
        ratio = {k: best_within(rows, k, cfg)[0] / optimum for k in ks}
        per_seed.append({"seed": seed, "ratio": ratio, "best": best, "params": params})
    median = {k: stat([s["ratio"][k] for s in per_seed]).median for k in ks}
    return {"sampler": label, "median": median, "seeds": per_seed}


def print_report(grid: dict, results: list[dict], trials: int) -> None:
    print(f"grid: space.grid(context, max_points_per_param={grid['max_points_per_param']}), "
          f"{grid['size']:,} points at concurrency {grid['levels']}, {grid['seconds']:.0f} s "
          f"on {PROCESSES} processes")
    print(f"grid optimum: {grid['optimum']:,.1f} tok/s  {_fmt(grid['params'])}\n")
    ks = list(results[0]["median"])
    print("best feasible tok/s at target / grid optimum, median over seeds")
    print(f"{'sampler':<18}" + "".join(f"{'k=' + str(k):>8}" for k in ks)
          + f"   per seed at k={trials}")
    for r in results:
        per_seed = " ".join(f"{s['ratio'][trials]:.3f}" for s in r["seeds"])
        print(f"{r['sampler']:<18}" + "".join(f"{r['median'][k]:>8.3f}" for k in ks)
              + f"   {per_seed}")
    for label in (r["sampler"] for r in results if VARIANTS[r["sampler"]].note):
        print(f"  {label}: bench-only, {VARIANTS[label].note}")
    print(f"\nbest params per seed at k={trials} (differences from the grid optimum):")
    for r in results:
        for s in r["seeds"]:
            diff = {k: v for k, v in s["params"].items() if grid["params"].get(k) != v}
            print(f"  {r['sampler']:<18} seed {s['seed']}  {s['best']:>8,.1f}  {_fmt(diff)}")


def _fmt(params: dict | None) -> str:
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in (params or {}).items()) or "(same)"


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--max-points", type=int, default=8, help="grid points per numeric param")
    parser.add_argument("--samplers", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args(argv)
    timer = Timer()
    print(f"{host_line()}, optuna {optuna.__version__}", file=sys.stderr)
    grid = grid_optimum(args.max_points)
    results = [sampler_runs(s, args.seeds, args.trials, grid["optimum"]) for s in args.samplers]
    print_report(grid, results, args.trials)
    tpe = next((r["median"][args.trials] for r in results if r["sampler"] == "tpe"), None)
    holds = tpe is not None and tpe >= CRITERION
    print(f"\ncriterion (tpe median at {args.trials} trials >= {CRITERION}): "
          f"{'HOLDS' if holds else 'MISSED'} ({tpe if tpe is None else round(tpe, 3)})")
    print(f"total runtime: {timer.s:.0f} s")
    save_json(args.json, {"grid": grid, "samplers": results, "criterion": CRITERION,
                          "holds": holds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
