"""Nightly re-measurement of a study's chosen configuration, judged against its history.

The public entry point is :func:`run_nightly`; see ``docs/NIGHTLY.md`` for the rule and the
tables it writes.
"""

from tuner.nightly.run import EXIT_OK
from tuner.nightly.run import EXIT_REGRESSION
from tuner.nightly.run import EXIT_UNMEASURABLE
from tuner.nightly.run import NightlyOutcome
from tuner.nightly.run import run_nightly

__all__ = ["EXIT_OK", "EXIT_REGRESSION", "EXIT_UNMEASURABLE", "NightlyOutcome", "run_nightly"]
