"""Which knob mattered: Optuna's parameter importance over the study's successful trials."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from dataclasses import field

import sqlalchemy as sa

from tuner.dashboard.optuna_study import load_optuna_study

OBJECTIVES = ("output tok/s at target", "tok/s per user at 1")  # the study's value order
MIN_TRIALS = 2  # importance evaluators need at least two completed trials


@dataclass(slots=True)
class Importance:
    # objective name -> parameter -> share of the variance it explains
    by_objective: dict[str, dict[str, float]] = field(default_factory=dict)
    note: str = ""


def param_importance(engine: sa.Engine, storage_url: str, study_name: str) -> Importance:
    """Never raises: what cannot be computed becomes the note shown in its place."""
    study, why = load_optuna_study(engine, storage_url, study_name)
    if study is None:
        return Importance(note=why)
    import optuna

    trials = _successful(study)
    if len(trials) < MIN_TRIALS:
        return Importance(note=f"needs at least {MIN_TRIALS} successful trials "
                               f"(the study has {len(trials)})")
    # Failed trials score 0 in the study; kept, they would make "what fails" the top knob.
    # The failures view covers those, so importance is judged on successes only.
    ok = optuna.create_study(directions=study.directions)
    ok.add_trials(trials)
    return _evaluate(ok)


def _successful(study) -> list:
    import optuna

    from tuner.objective import FAILURE_KEY
    from tuner.study import MEASURED_KEY

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return [t for t in done if t.user_attrs.get(MEASURED_KEY) and FAILURE_KEY not in t.user_attrs]


def _evaluate(study) -> Importance:
    import optuna

    result = Importance()
    for index, name in enumerate(OBJECTIVES[:len(study.directions)]):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                values = optuna.importance.get_param_importances(
                    study, target=lambda t, i=index: t.values[i])
        except Exception as err:  # e.g. every trial used one value of a parameter
            return Importance(note=f"parameter importance could not be computed: {err}")
        result.by_objective[name] = dict(values)
    if not any(result.by_objective.values()):
        result.note = "no parameter varied across the successful trials"
    return result
