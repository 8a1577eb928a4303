"""Dashboard report generation on a 1,000-trial study (target: < 5 s, file < 10 MB).

The study is real model-backend trials: random samples of the pcie8_kimi space measured by the
performance model through the tuner's own Objective, recorded in our tables, and copied into an
Optuna study in the same DB (so parameter importance runs on 1,000 trials too). Building it
takes ~30 s, almost all of it Optuna's per-trial inserts; ``--db`` keeps it for the next run.

    python bench/dashboard_bench.py [--trials 1000] [--repeats 3] [--db PATH] [--seed 0] [--json OUT]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import optuna

# tests/tuner_tests/test_dashboard.py loads this file by path, without bench/ on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Timer, arguments, host_line, samples, save_json, stat  # noqa: E402

STUDY = "bench-dashboard"


def synthetic_study(folder: Path, n_trials: int, with_optuna: bool = True,
                    name: str = STUDY, seed: int = 0) -> str:
    """A study of ``n_trials`` random model-backend trials in ``folder/results.db``; returns
    the storage URL. Without ``with_optuna`` only our tables are written (seconds, not ~30 s)."""
    from tuner import records
    from tuner.config import Config
    from tuner.interrupt import InterruptGate
    from tuner.objective import Objective
    from tuner.objective import TransientFailure
    from tuner.wiring import backend_from
    from tuner.wiring import space_context
    from tuner.wiring import space_from
    from tuner.wiring import workload_from

    url = f"sqlite:///{folder / 'results.db'}"
    cfg = Config.model_validate({"study": {"name": name, "storage": url, "sampler": "random"}})
    engine = records.connect(url)
    records.save_study_config(engine, name, cfg.model_dump(mode="json"))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # In memory first: Optuna's RDB inserts are what is slow, and only the copy needs them.
    study = optuna.create_study(directions=["maximize"] * 2,
                                sampler=optuna.samplers.RandomSampler(seed=seed))
    objective = Objective(
        space=space_from(cfg),
        context=space_context(cfg), backend=backend_from(cfg), workload=workload_from(cfg),
        target_concurrency=cfg.workload.target_concurrency, limits=cfg.workload.limits,
        study_name=name, engine=engine, gate=InterruptGate())
    study.optimize(objective, n_trials=n_trials, catch=(TransientFailure,))
    if with_optuna:
        stored = optuna.create_study(study_name=name, storage=url, directions=["maximize"] * 2)
        stored.add_trials(study.trials)
    return url


def measure(url: str, out: Path, repeats: int) -> tuple[list[float], int]:
    from tuner.dashboard import write_report

    times = samples(lambda: write_report(url, STUDY, out), repeats, warmup=0)
    return times, out.stat().st_size


def main() -> None:
    parser = arguments(__doc__, repeats=3, seed=0)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--db", type=Path, help="folder to keep the study in (reused if there)")
    args = parser.parse_args()
    scratch = None if args.db else tempfile.TemporaryDirectory(prefix="dashboard-bench-")
    folder = args.db or Path(scratch.name)  # a scratch study goes when the process ends
    folder.mkdir(parents=True, exist_ok=True)
    timer = Timer()
    if (folder / "results.db").exists():
        url, built = f"sqlite:///{folder / 'results.db'}", "reused"
    else:
        url = synthetic_study(folder, args.trials, seed=args.seed)
        built = f"built in {timer.s:.0f} s"
    times, size = measure(url, folder / "report.html", args.repeats)
    median = stat(times).median
    print(f"dashboard report, {args.trials} trials: median {median:.2f} s over {args.repeats} "
          f"(target < 5 s), {size / 1e6:.1f} MB (target < 10 MB); study {built}")
    print(host_line(), file=sys.stderr)
    save_json(args.json, {"trials": args.trials, "median_s": round(median, 3),
                          "runs_s": [round(t, 3) for t in times],
                          "size_mb": round(size / 1e6, 2), "study": built})


if __name__ == "__main__":
    main()
