"""Fuzzing the CLIs' inputs in the suite: a fixed, derandomized budget of generated and
mutated config files, ``--set`` values, sweep files and RLlib files (``fuzz_cases.py``);
each ends in success or one error line and exit 2, without a traceback, within 2 s and
200 MB. ``benchmarks/fuzz.py`` runs the same cases for as long as it is given."""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis")
pytest.importorskip("optuna")

from fuzz_cases import STRATEGIES, run_case  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402

BUDGET = {"config": 60, "set": 60, "sweep": 60, "rllib": 40}
"""Examples per target: the whole module takes about half a minute on one free core."""


def _fuzz(target: str):
    @settings(
        max_examples=BUDGET[target],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(doc=STRATEGIES[target])
    def test(doc):
        case = run_case(target, doc)
        problem = case.problem()
        assert problem is None, (problem, case.argv, case.err, str(doc)[:500])

    return test


test_fuzz_config_files = _fuzz("config")
test_fuzz_set_values = _fuzz("set")
test_fuzz_sweep_files = _fuzz("sweep")
test_fuzz_rllib_files = _fuzz("rllib")
