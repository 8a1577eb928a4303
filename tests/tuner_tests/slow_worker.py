"""``python slow_worker.py BACKEND SECONDS run ...``: the real ``dflash-tune``, each measurement of
BACKEND (``model``: a trial; ``simulated``: one level of a launch) SECONDS slower, so that
workers overlap and one can be killed mid-trial. The launch-aware screen's own model
evaluations keep their speed."""

from __future__ import annotations

import sys
import time

from backends.perf_model import PerfModelBackend
from backends.simulated import _NoisySession
from tuner.cli import main

MEASURES = {"model": (PerfModelBackend, "measure"), "simulated": (_NoisySession, "_level")}


def _slowed(measure, seconds: float):
    def slow(*args):
        time.sleep(seconds)
        return measure(*args)

    return slow


if __name__ == "__main__":
    owner, name = MEASURES[sys.argv.pop(1)]
    setattr(owner, name, _slowed(getattr(owner, name), float(sys.argv.pop(1))))
    sys.argv[0] = "dflash-tune"
    main()
