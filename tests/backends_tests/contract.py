"""The contract every CPU-runnable backend must honour (Optuna's ``StorageTestCase`` pattern).

Subclass :class:`BackendContract` in a ``test_*.py`` module as ``Test<Name>Contract`` and override
its fixtures; pytest then runs every test below against that backend. The base class is not
collected on its own (its name does not start with ``Test``).

Fixtures to provide (configurations as LaunchParams, which are valid by construction: what
no engine can launch never parses, see test_launch_params.py):
  backend      the instance under test
  workload     a small workload (a few concurrency levels; it runs many times)
  good_params  a configuration that fits and measures successfully
  bad_params   {case name: params} that this deployment cannot launch (GPU count mismatch, a
               block above the drafter's, ...) -> INVALID_CONFIG
  oom_params   a configuration that is valid but does not fit in memory -> OOM
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from backends import Backend, FailureClass, LaunchParams, Measurement, Workload
from backends.contract import LaunchFailed


def _abstract(name: str):
    raise NotImplementedError(f"a BackendContract subclass must override the {name!r} fixture")


class BackendContract:
    @pytest.fixture
    def backend(self) -> Backend:
        _abstract("backend")

    @pytest.fixture
    def workload(self) -> Workload:
        _abstract("workload")

    @pytest.fixture
    def good_params(self) -> LaunchParams:
        _abstract("good_params")

    @pytest.fixture
    def bad_params(self) -> dict[str, LaunchParams]:
        _abstract("bad_params")

    @pytest.fixture
    def oom_params(self) -> LaunchParams:
        _abstract("oom_params")

    # --- flags ---------------------------------------------------------------------------------

    def test_flags_are_a_deterministic_list_of_str(self, backend, good_params):
        argv = backend.flags(good_params)
        assert isinstance(argv, list) and argv
        assert all(isinstance(arg, str) for arg in argv)
        assert backend.flags(replace(good_params)) == argv

    def test_env_is_a_dict_of_str(self, backend, good_params):
        env = backend.env(good_params)
        assert isinstance(env, dict)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())

    # --- measure: shape ------------------------------------------------------------------------

    def test_measure_returns_one_row_per_concurrency_level_in_order(self, backend, good_params,
                                                                    workload):
        rows = backend.measure(good_params, workload)
        assert [m.concurrency for m in rows] == list(workload.concurrency)
        assert all(isinstance(m, Measurement) for m in rows)
        assert all(m.ok for m in rows), [m.log_excerpt for m in rows if not m.ok]

    def test_measure_is_reentrant(self, backend, good_params, workload):
        first = backend.measure(good_params, workload)
        second = backend.measure(good_params, workload)
        assert len(first) == len(second) == len(workload.concurrency)
        if backend.predicts:  # a model has no noise: the same question gets the same answer
            assert [m.to_dict() for m in first] == [m.to_dict() for m in second]

    def test_rows_say_whether_they_are_predicted(self, backend, good_params, workload):
        assert all(m.predicted is backend.predicts for m in backend.measure(good_params, workload))

    # --- measure: failures are rows, never exceptions --------------------------------------------

    def test_invalid_params_are_reported_not_raised(self, backend, bad_params, workload):
        assert bad_params, "give at least one invalid configuration"
        for case, params in bad_params.items():
            rows = backend.measure(params, workload)
            assert [m.concurrency for m in rows] == list(workload.concurrency), case
            for m in rows:
                assert m.failure is FailureClass.INVALID_CONFIG, (case, m.failure, m.log_excerpt)
                assert m.log_excerpt.strip(), case
                assert m.output_tok_s == 0.0, case

    def test_oom_config_is_reported_not_raised(self, backend, oom_params, workload):
        rows = backend.measure(oom_params, workload)
        assert [m.concurrency for m in rows] == list(workload.concurrency)
        for m in rows:
            assert m.failure is FailureClass.OOM, (m.failure, m.log_excerpt)
            assert m.failure.is_deterministic
            assert m.log_excerpt.strip()

    # --- units -----------------------------------------------------------------------------------

    def test_units_are_consistent(self, backend, good_params, workload):
        gpus = good_params.gpus
        for m in backend.measure(good_params, workload):
            assert m.output_tok_s > 0
            assert m.output_tok_s_per_gpu * gpus == pytest.approx(m.output_tok_s, rel=1e-6)
            assert m.tok_s_per_user * m.concurrency == pytest.approx(m.output_tok_s, rel=1e-6)
            assert m.tpot_p50_ms is not None and m.tpot_p50_ms > 0
            assert m.tpot_p99_ms is None or m.tpot_p99_ms >= m.tpot_p50_ms
            assert m.ttft_p50_ms is None or m.ttft_p50_ms > 0
            assert m.accept_len_mean is None or m.accept_len_mean >= 1.0
            assert all(math.isfinite(v) and v >= 0 for v in m.breakdown_ms.values())

    # --- serialisation ---------------------------------------------------------------------------

    def test_rows_serialise_to_json(self, backend, good_params, oom_params, workload):
        rows = backend.measure(good_params, workload) + backend.measure(oom_params, workload)
        for m in rows:
            back = json.loads(json.dumps(m.to_dict()))
            assert back["concurrency"] == m.concurrency
            assert back["failure"] == (m.failure.value if m.failure else None)

    def test_a_session_measures_levels_one_at_a_time(self, backend, good_params, workload):
        with backend.session(good_params, workload) as session:
            rows = [session.measure(c) for c in reversed(workload.concurrency)]
        assert [m.concurrency for m in rows] == list(reversed(workload.concurrency))
        assert all(m.ok and m.output_tok_s > 0 for m in rows)
        assert session.clock.launch_s >= 0 and session.clock.measure_s >= 0

    def test_a_session_that_cannot_launch_raises_launch_failed(self, backend, bad_params,
                                                               workload):
        for why, params in bad_params.items():
            with pytest.raises(LaunchFailed) as failed:
                with backend.session(params, workload):
                    pass
            assert failed.value.failure.is_deterministic, why
