"""Launch-aware tuning vs plain TPE on a noisy node with a real launch cost.

The node is the `simulated` backend: the performance model with hidden constants (the truth),
measured with `--noise` relative SD and `--launch-s` virtual seconds per launch. The true
optimum is the best noiseless goodput at the SLA over a 6-point-per-parameter grid of the space,
walked to a local optimum, and raised to any configuration a tuner picked that is better.

Plain TPE: one launch per trial, the same SLA search inside each launch, the final choice is
the best measured value (what a tuner that trusts single runs crowns). Launch-aware: the
`tuning.strategy: launch_aware` path. Both are scored by the TRUE goodput of their choice.

With ``--workers N`` the launch-aware study is shared by N workers, played in virtual time: the
wall time is when the last launch lands, and the launch time is still the sum over launches.

    python bench/launch_budget_bench.py [--seeds 10] [--tpe-budgets 20,40,80] [--workers 3]
        [--json OUT]
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna  # noqa: E402
from harness import Timer, arguments, host_line, save_json, stat, table  # noqa: E402

from backends import LaunchParams  # noqa: E402
from search_spaces import load_space  # noqa: E402
from tuner.config import Config  # noqa: E402
from tuner.config import load_config  # noqa: E402
from tuner.launches.run import build  # noqa: E402
from tuner.launches.strategy import Claimed  # noqa: E402
from tuner.launches.strategy import Done  # noqa: E402
from tuner.launches.strategy import Plan  # noqa: E402
from tuner.launches.worker import LaunchWorker  # noqa: E402
from tuner.launches.sla_search import search_limit  # noqa: E402
from tuner.wiring import backend_from  # noqa: E402
from tuner.wiring import space_context  # noqa: E402
from tuner.wiring import truth_screen  # noqa: E402
from tuner.wiring import workload_from  # noqa: E402

# The node's hidden truth differs from the tuner's starting model (tuner.yaml's defaults): a
# slower interconnect, less achieved bandwidth, a weaker drafter.
TRUTH = {"efficiency": {"bandwidth_efficiency": 0.5, "collective_latency_us": 70.0,
                        "launch_overhead_us": 30.0, "matmul_fixed_us": 0.3},
         "acceptance": [0.7]}


def config(seed: int, noise: float, launch_s: float, strategy: str, db: Path,
           launches: int, launch_share: float = 0.5, repeats: int = 3) -> Config:
    return load_config(None, {
        "study.name": f"{strategy}-{seed}", "study.storage": f"sqlite:///{db}",
        "study.seed": seed, "backend.name": "simulated",
        "backend.simulation": {"noise": noise, "launch_s": launch_s, "seed": seed,
                               "launch_share": launch_share, **TRUTH},
        "tuning.strategy": strategy, "tuning.launches": launches, "tuning.repeats": repeats,
        "tuning.gates": {"soak_s": 0.0}})


class Truth:
    """Noiseless goodput at the SLA: the Screen's exact search on the truth's constants."""

    def __init__(self, cfg: Config) -> None:
        self.screen = truth_screen(cfg, samples=3000)
        self.space, self.context = self.screen.space, self.screen.context

    def value(self, params: dict) -> float:
        p = self.screen.predict(params)
        return p.goodput if p else 0.0

    def optimum(self) -> tuple[float, dict]:
        """Best of the grid's and the screen's top configurations, each walked to a local
        optimum of the noiseless truth."""
        starts = sorted(self.space.grid(self.context, 6), key=self.value, reverse=True)[:8]
        starts += [p.params for p in self.screen.propose(8, set())]
        rng, found = random.Random(0), []
        for start in sorted(starts, key=self.value, reverse=True)[:8]:
            found += self.screen.walk(self.screen.predict(start), rng, sweeps=1000)
        best = max(found, key=lambda p: p.goodput)
        return best.goodput, best.params


def plain_tpe(cfg: Config, trials: int) -> tuple[dict, float]:
    """One launch per TPE trial, SLA search inside; the best single measured value wins."""
    space, context = load_space(cfg.search_space), space_context(cfg)
    backend, workload, limits = backend_from(cfg), workload_from(cfg), cfg.workload.limits
    top = max(cfg.workload.concurrency)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(direction="maximize",
                                    sampler=optuna.samplers.TPESampler(seed=cfg.study.seed))
    best: tuple[float, dict] = (-1.0, {})
    launch_s = 0.0
    for _ in range(trials):
        trial = study.ask()
        params = space.suggest(trial, context)
        if space.violations(params, context):
            study.tell(trial, 0.0)  # rejected before launching, as `run` does
            continue
        value = 0.0
        try:
            with backend.session(LaunchParams.from_params(params), workload) as session:
                launch_s += session.clock.launch_s
                found = search_limit(session.measure, limits, top)
                value = found.best.output_tok_s if found.best else 0.0
        except Exception:  # LaunchFailed (an OOM layout) or InvalidParams: worth 0
            launch_s += cfg.backend.simulation.launch_s
        study.tell(trial, value)
        best = max(best, (value, params), key=lambda b: b[0])
    return best[1], launch_s


def launch_aware(cfg: Config, workers: int) -> tuple[dict | None, float, float]:
    """The winner, the launch time and the study's wall time (virtual seconds)."""
    worker = build(cfg)
    if workers > 1:
        return in_virtual_time(worker, workers, cfg.backend.simulation.launch_s)
    outcome = worker.run()  # the real loop: claims and records, one worker
    return (outcome.winner and outcome.winner.params, outcome.launch_s,
            outcome.launch_s + outcome.measure_s)


def in_virtual_time(worker: LaunchWorker, workers: int, launch_s: float
                    ) -> tuple[dict | None, float, float]:
    """``workers`` workers on one study, in virtual time: whichever is free first decides from
    the launches finished by then and those still running, as each real worker does under the
    study's claim lock (``LaunchAware.next_launch``). Each worker's idle time goes to stderr."""
    free, flying, done, spent = [0.0] * workers, [], [], 0.0
    idle = [0.0] * workers
    while True:
        i = min(range(workers), key=free.__getitem__)
        now = free[i]
        landed = sorted((x for x in flying if x[0] <= now), key=lambda x: x[0])
        done += [launch for _, _, launch in landed]
        flying = [x for x in flying if x[0] > now]
        decision = worker.strategy.next_launch(done, [claimed for _, claimed, _ in flying])
        if isinstance(decision, Done):
            print(f"wall {now / 3600:.2f} h; idle per worker (h): "
                  f"{', '.join(f'{x / 3600:.2f}' for x in idle)}", file=sys.stderr)
            return decision.winner and decision.winner.params, spent, now
        if not isinstance(decision, Plan):  # wait for the next launch to land
            free[i] = min(x[0] for x in flying)
            idle[i] += free[i] - now
            continue
        g = worker.gates
        result = worker.launcher.find(decision.params, decision.guess, decision.bar,
                                      g if decision.gated else None,
                                      g.record_reference if decision.reference else None)
        took = result.clock.launch_s + result.clock.measure_s or launch_s  # failed: a launch
        spent += result.clock.launch_s or launch_s
        free[i] = now + took
        flying.append((free[i], Claimed(decision.params, decision.gated, decision.reference),
                       result))


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--noise", type=float, default=0.15)
    ap.add_argument("--launch-s", type=float, default=180.0)
    ap.add_argument("--launch-share", type=float, default=0.5,
                    help="share of the noise variance drawn once per launch")
    ap.add_argument("--launches", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3, help="tuning.repeats of launch_aware")
    ap.add_argument("--tpe-budgets", default="24,48,96")
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--workers", type=int, default=1,
                    help="launch_aware workers sharing the study (more than 1: in virtual time)")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    folder = tempfile.TemporaryDirectory(prefix="launch-budget-")  # the studies' DBs
    tmp = Path(folder.name)
    truth = Truth(config(0, args.noise, args.launch_s, "launch_aware", tmp / "t.db", 2))
    timer = Timer()
    optimum, opt_params = truth.optimum()
    print(f"true optimum {optimum:,.0f} tok/s ({timer.s:.0f} s): "
          f"{json.dumps(opt_params, sort_keys=True)}", file=sys.stderr)
    runs: dict[str, list[tuple[float, float]]] = {}
    for seed in range(args.seeds):
        cfg = config(seed, args.noise, args.launch_s, "launch_aware", tmp / f"{seed}.db",
                     args.launches, args.launch_share, args.repeats)
        params, launch_s, wall_s = launch_aware(cfg, args.workers)
        runs.setdefault(f"launch_aware ({args.launches} launches, {args.repeats} repeats, "
                        f"{args.workers} workers)", []).append(
            (truth.value(params) if params else 0.0, launch_s, wall_s))
        for budget in [int(b) for b in args.tpe_budgets.split(",") if b]:
            params, launch_s = plain_tpe(cfg, budget)
            runs.setdefault(f"plain TPE ({budget} trials)", []).append(
                (truth.value(params), launch_s, None))
        print(f"seed {seed} done ({timer.s:.0f} s)", file=sys.stderr)
    optimum = max([optimum] + [v for rows in runs.values() for v, _, _ in rows])
    report(runs, optimum, args)


def report(runs, optimum: float, args) -> None:
    print(f"noise {args.noise:.0%} ({args.launch_share:.0%} of its variance per launch), "
          f"launch {args.launch_s:.0f} s, {args.seeds} seeds; "
          f"true optimum {optimum:,.0f} tok/s at the SLA")
    summary, rows = {}, []
    for name, results in runs.items():
        ratios = [v / optimum for v, _, _ in results]
        hits = sum(r >= 1 - args.tolerance for r in ratios)
        hours = stat([s for _, s, _ in results]).median / 3600
        walls = [w for _, _, w in results if w is not None]
        wall = walls and stat(walls).median / 3600
        summary[name] = {"hits": hits, "ratios": ratios, "launch_h": hours, "wall_h": wall}
        rows.append([name, f"{hits}/{len(results)}", f"{stat(ratios).median:.3f}",
                     f"{min(ratios):.3f}", f"{hours:.1f}", wall and f"{wall:.2f}"])
    print(table(["strategy", f"within {args.tolerance:.0%} of optimum", "median true/opt",
                 "worst", "median launch time (h)", "median wall time (h)"], rows))
    print(host_line(), file=sys.stderr)
    save_json(args.json, {"optimum": optimum, "runs": summary})


if __name__ == "__main__":
    main()
