"""How a trial becomes our records, for both strategies (per-trial TPE and launch-aware).

The one place a configuration's launch command is rendered for the records and a trial row with
its measurements is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backends import Backend, InvalidParams, LaunchParams, Measurement
from backends.flags import render_shell
from tuner import records


@dataclass(slots=True)
class Recorder:
    backend: Backend
    engine: Any  # sqlalchemy Engine of our records
    study_name: str

    def save(self, trial_number: int, params: dict[str, Any], launch: LaunchParams | None,
             status: str, measured: bool, excerpt: str, rows: Sequence[Measurement]) -> None:
        """One trial: ``params`` as sampled, the command of ``launch`` (none for parameters that
        did not parse), its status and every level measured, in one transaction."""
        command, env = self.command(launch)
        record = records.TrialRecord(
            trial_number=trial_number, backend=self.backend.name, params=params,
            status=status, measured=measured, command=command, env=env, log_excerpt=excerpt,
            measurements={})
        records.save_trial(self.engine, self.study_name, record, rows)

    def command(self, launch: LaunchParams | None) -> tuple[str, dict[str, str]]:
        """The shell launch command and its environment; empty where the engine cannot
        express ``launch``."""
        if launch is None:
            return "", {}
        try:
            return render_shell(self.backend.flags(launch)), self.backend.env(launch)
        except InvalidParams:
            return "", {}

