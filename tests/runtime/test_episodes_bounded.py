"""Evaluation episodes on a cluster never wait without a bound: an env step that hangs
ends ``play_on_cluster`` with one line once no episode has finished for ``stall_s``
(before, the command waited for ever). A real ``LocalCluster``, the hanging env of
``tests/misbehaving_envs.py``."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])

from apex_dask.algo.agents import registry  # noqa: E402
from apex_dask.config import ApexConfig  # noqa: E402
from apex_dask.experiment.builder import agent_spec, env_factory  # noqa: E402
from apex_dask.runtime.orchestration.episodes import EpisodeFailed, play_on_cluster  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_hung_env_step_ends_the_evaluation_in_one_line_after_stall_s():
    from distributed import Client, LocalCluster

    cfg = ApexConfig.preset("cartpole").override(
        {"env.env_id": "misbehaving_envs:HangStep-v0", "env.env_kwargs": {"at": 5}}
    )
    factory, spec = env_factory(cfg), agent_spec(cfg)
    env = factory()
    learner = registry.make_learner(spec, env.observation_space, env.action_space, seed=0)
    _, weights = learner.get_weights()
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        started = time.monotonic()
        with pytest.raises(EpisodeFailed) as err:
            play_on_cluster(client, factory, spec, weights, episodes=2, base_seed=0, stall_s=3.0)
        took = time.monotonic() - started
    assert str(err.value) == (
        "no evaluation episode finished in 3 s (a hung env step? set env.step_timeout_s)"
    )
    assert took < 60, took  # the warm-up (torch import) and 3 s, not the hour the step sleeps
