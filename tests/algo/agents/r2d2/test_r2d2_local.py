"""The in-process runner drives the r2d2 agent with the same parts as the Dask runner."""

from __future__ import annotations

import math

import pytest

from apex_dask.config import ApexConfig
from apex_dask.local import run_local


@pytest.mark.slow  # a short training run (about 15 s)
def test_the_in_process_runner_trains_r2d2_and_reports_staleness():
    cfg = ApexConfig.preset("cartpole_pomdp").override(
        {
            "replay.learning_starts": 20,
            "eval.episodes": 1,
            "eval.interval_s": 0,
            "report.timesteps_per_iteration": 400,
            "report.min_iter_time_s": 0,
        }
    )
    rows = list(run_local(cfg, stop={"timesteps": 800}))
    last = rows[-1]
    assert last["learner/updates"] > 0 and last["replay/size"] > 0
    staleness = last["learner/state_staleness"]
    assert not math.isnan(staleness) and 0 <= staleness <= last["learner/version"]
    assert last["learner/steps_trained"] > 0 and "eval/return_mean" in last
