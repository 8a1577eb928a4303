"""How often the nightly rule flags a true slowdown, by reference kind (simulated, seeded).

5 repeats, 3% Gaussian noise, threshold 5%, k = 3 (the `dflash-tune nightly` defaults); the
reference is the study's own number (exact) or the median of 1, 3 or 5 earlier noisy runs.

    python bench/nightly_rule_bench.py [--nights 20000] [--seed 1] [--json OUT]
"""

from __future__ import annotations

import sys

from harness import arguments, host_line, save_json, table

from tuner.nightly.compare import flag_rate

REFERENCES = {"the study's own number (first night)": 0, "1 earlier run": 1,
              "median of 3 earlier runs": 3, "median of 5 earlier runs": 5}
DROPS = {"10% slower": 0.10, "2% slower": 0.02, "no change": 0.0}


def main() -> None:
    parser = arguments(__doc__, seed=1)
    parser.add_argument("--nights", type=int, default=20000)
    args = parser.parse_args()
    rates = {name: {drop: flag_rate(share, runs, args.nights, seed=args.seed)
                    for drop, share in DROPS.items()} for name, runs in REFERENCES.items()}
    print(table(["reference", *(f"{drop}: flagged" for drop in DROPS)],
                [[name, *(f"{r:.1%}" for r in row.values())] for name, row in rates.items()]))
    print(host_line(), file=sys.stderr)
    save_json(args.json, {"nights": args.nights, "seed": args.seed, "flag_rates": rates})


if __name__ == "__main__":
    main()
