"""Our own tables beside Optuna's in the same database, and the functions that read and write
them. ``tables`` holds every table (one ``MetaData``; ``connect`` creates them all), ``study``
a study's trials and winners, ``nightly`` the nightly runs, ``serialize`` how a measurement is
stored in either.
"""

from tuner.records.study import GATES_PASSED
from tuner.records.study import TrialRecord
from tuner.records.study import load_study_config
from tuner.records.study import load_trials
from tuner.records.study import load_winner
from tuner.records.study import save_study_config
from tuner.records.study import save_trial
from tuner.records.study import save_winner
from tuner.records.study import study_names
from tuner.records.tables import connect
from tuner.records.tables import measurements
from tuner.records.tables import missing_sqlite_file
from tuner.records.tables import open_results
from tuner.records.tables import studies
from tuner.records.tables import trials
from tuner.records.tables import winners

__all__ = ["GATES_PASSED", "TrialRecord", "connect", "load_study_config", "load_trials",
           "load_winner", "measurements", "missing_sqlite_file", "open_results",
           "save_study_config",
           "save_trial", "save_winner", "studies", "study_names", "trials", "winners"]
