"""How well the calibrated performance model reproduces a reference's measurements.

Fits the four efficiency constants to the reference, then prints a plain table (observation,
observed, predicted, ratio), the fitted constants, and the checks with PASS / FAIL: every
observation within 25%, constants physically plausible, and the conclusions the user drew from
the measurements. Exit code 0 when every check passes, 1 when one fails, 2 for a bad reference.

    pip install -e .     # once; the script imports the installed `backends` package
    python bench/model_vs_reference.py [--reference pcie8_kimi_sglang] [--json OUT]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

try:
    import backends  # noqa: F401
except ImportError:  # not installed: run from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import arguments, host_line, save_json, table

from backends.perf_model.calibrate import Comparison
from backends.perf_model.constants import Efficiency
from backends.perf_model.global_fit import fit_reference
from backends.perf_model.references import load_reference

TOLERANCE = 0.25
# (check, predicate over predicted tok/s by observation name); a check whose observations the
# reference lacks is reported SKIP.
Predicted = dict[str, float]
CONCLUSIONS: tuple[tuple[str, Callable[[Predicted], bool]], ...] = (
    ("CUDA graphs 3-4x at concurrency 1 on TP8",
     lambda p: 3.0 <= p["TP8 graphs c1"] / p["TP8 eager c1"] <= 4.0),
    ("DFlash (EP8, eager, block 8) ahead of plain EP8 at concurrency 1",
     lambda p: p["EP8 DFlash eager c1"] > p["EP8 graphs c1"]),
    ("DFlash (EP8, eager, block 8) behind plain EP8 at peak",
     lambda p: p["EP8 DFlash eager peak"] < p["EP8 graphs peak"]),
    ("EP8 ahead of TP8 at peak", lambda p: p["EP8 graphs peak"] > p["TP8 graphs peak"]),
    ("EP4 ahead of TP8 at peak", lambda p: p["EP4 graphs peak"] > p["TP8 graphs peak"]),
)


def calibrate(name: str) -> tuple[Efficiency, list[Comparison]]:
    return fit_reference(load_reference(name))


def checks(eff: Efficiency, rows: list[Comparison]) -> list[tuple[str, str]]:
    worst = max(rows, key=lambda r: abs(r.ratio - 1.0))
    out = [(f"every observation within {TOLERANCE:.0%} (worst: {worst.name}, {worst.ratio:.2f})",
            _status(abs(worst.ratio - 1.0) <= TOLERANCE)),
           ("bandwidth efficiency in (0.3, 1]", _status(0.3 < eff.bandwidth_efficiency <= 1.0)),
           ("collective latency 5-200 us", _status(5 <= eff.collective_latency_us <= 200)),
           ("launch overhead 5-100 us", _status(5 <= eff.launch_overhead_us <= 100))]
    predicted = {r.name: r.predicted for r in rows}
    for text, holds in CONCLUSIONS:
        try:
            out.append((text, _status(holds(predicted))))
        except KeyError:
            out.append((text, "SKIP"))
    return out


def _status(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def print_report(name: str, eff: Efficiency, rows: list[Comparison],
                 results: list[tuple[str, str]]) -> None:
    print(f"model vs {name}  (output tok/s)\n")
    print(table(["observation", "observed", "predicted", "ratio"],
                [[r.name, f"{r.observed:.1f}", f"{r.predicted:.1f}", f"{r.ratio:.3f}"]
                 for r in rows]))
    print("\nfitted constants")
    for key, value in eff.as_dict().items():
        print(f"  {key:<22} {value:.4g}")
    print("\nchecks")
    for text, status in results:
        print(f"  {status:<4}  {text}")


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--reference", default="pcie8_kimi_sglang",
                        help="shipped reference name or a reference YAML file")
    args = parser.parse_args(argv)
    try:
        eff, rows = calibrate(args.reference)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    results = checks(eff, rows)
    print_report(args.reference, eff, rows, results)
    print(host_line(), file=sys.stderr)
    save_json(args.json, {
        "reference": args.reference,
        "observations": [{"name": r.name, "observed": r.observed, "predicted": r.predicted,
                          "ratio": r.ratio} for r in rows],
        "constants": eff.as_dict(),
        "checks": [{"check": text, "status": status} for text, status in results]})
    return 1 if any(status == "FAIL" for _, status in results) else 0


if __name__ == "__main__":
    sys.exit(main())
