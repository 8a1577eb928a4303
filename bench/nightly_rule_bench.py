"""How often the nightly rule flags a true slowdown, by reference kind (simulated, seeded).

5 repeats, 3% Gaussian noise, threshold 5%, k = 3 (the `dflash-tune nightly` defaults); the
reference is the study's own number (exact) or the median of 1, 3 or 5 earlier noisy runs.

    python bench/nightly_rule_bench.py [--nights 20000]
"""

from __future__ import annotations

import argparse

from tuner.nightly.compare import flag_rate

REFERENCES = {"the study's own number (first night)": 0, "1 earlier run": 1,
              "median of 3 earlier runs": 3, "median of 5 earlier runs": 5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=20000)
    nights = parser.parse_args().nights
    print("| reference | 10% slower: flagged | 2% slower: flagged | no change: flagged |")
    print("|---|---|---|---|")
    for name, runs in REFERENCES.items():
        rates = [flag_rate(drop, runs, nights) for drop in (0.10, 0.02, 0.0)]
        print(f"| {name} | " + " | ".join(f"{r:.1%}" for r in rates) + " |")


if __name__ == "__main__":
    main()
