"""Several ``dflash-tune run`` workers as real processes on one study, and what their study holds
(tests/tuner_tests/test_scale_out.py, test_launch_scale_out.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import optuna
import sqlalchemy as sa

from tuner.budget import WORKER_KEY
from tuner.config import StudyConfig

SLOW_WORKER = Path(__file__).with_name("slow_worker.py")


def worker(folder: Path, url: str, delay_s: float, *args: str, backend: str = "model"
           ) -> subprocess.Popen:
    """The real CLI's ``run`` as its own process, each measurement of ``backend`` ``delay_s``
    slower (slow_worker.py)."""
    argv = [sys.executable, str(SLOW_WORKER), backend, str(delay_s), "run", "-c",
            str(folder / "tuner.yaml"), "--storage", url, *args]
    return subprocess.Popen(argv, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finished(proc: subprocess.Popen, timeout: float = 60) -> str:
    """The worker's stderr; it must have exited 0."""
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return err


def trials_of(url: str, study: str) -> list[optuna.trial.FrozenTrial]:
    url = StudyConfig(storage=url).storage  # the psycopg2 driver, as the CLI reads it
    return optuna.load_study(study_name=study, storage=url).get_trials()


def records_of(url: str, study: str) -> dict[int, bool]:
    """Trial number -> measured, for each record; one record a trial number."""
    engine = sa.create_engine(StudyConfig(storage=url).storage)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("select trial_number, measured from dflash_tune_trials "
                                        "where study = :s"), {"s": study}).all()
    finally:
        engine.dispose()
    assert len(rows) == len({number for number, _ in rows})
    return {number: bool(measured) for number, measured in rows}


def wait_until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def running_trial_of(proc: subprocess.Popen, url: str, study: str
                     ) -> optuna.trial.FrozenTrial:
    """Wait until ``proc`` is inside a trial's measurement."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            running = [t for t in trials_of(url, study) if t.state.name == "RUNNING"
                       and t.user_attrs.get(WORKER_KEY, "").endswith(f":{proc.pid}")]
        except (KeyError, sa.exc.SQLAlchemyError):  # no study or tables yet
            running = []
        if running:
            return running[0]
        time.sleep(0.2)
    raise AssertionError("the worker never started a trial")
