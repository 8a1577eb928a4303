"""``python slow_worker.py SECONDS run ...``: the real ``dflash-tune``, each measurement of the
model backend SECONDS slower, so that workers overlap and one can be killed mid-trial."""

from __future__ import annotations

import sys
import time

from backends.perf_model import PerfModelBackend
from tuner.cli import main


def _slowed(seconds: float):
    measure = PerfModelBackend.measure

    def slow(self, params, workload):
        time.sleep(seconds)
        return measure(self, params, workload)

    return slow


if __name__ == "__main__":
    PerfModelBackend.measure = _slowed(float(sys.argv.pop(1)))
    sys.argv[0] = "dflash-tune"
    main()
