"""Image envs through the Dask runtime: a short MinAtar training run (CNN, batched acting,
bounded evaluation) on a real 2-process LocalCluster."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("minatar")

from apex_dask.config import ApexConfig  # noqa: E402
from apex_dask.runtime.orchestration.driver import train  # noqa: E402

pytestmark = pytest.mark.slow  # trains MinAtar on a 2-process LocalCluster

ITERATIONS = 3


def test_minatar_trains_through_the_dask_runtime_with_batched_acting(client):
    cfg = ApexConfig.preset("minatar").override(
        {
            "replay.capacity": 20_000,
            "replay.learning_starts": 400,
            "learner.batch_size": 32,
            "learner.target_update_freq": 2_000,
            "learner.max_replay_ratio": 4.0,
            "learner.min_replay_ratio": 1.0,
            "workers.num_workers": 2,
            "workers.envs_per_worker": 4,
            "workers.rollout_fragment_length": 25,
            "workers.rollouts_per_call": 1,
            # a greedy MinAtar policy may never lose: the cap ends its episodes
            "eval.interval_s": 2.0,
            "eval.episodes": 1,
            "eval.max_episode_steps": 200,
            "eval.timeout_s": 30.0,
            "report.min_iter_time_s": 1.0,
            "report.timesteps_per_iteration": 1_000,
            "topology.call_timeout_s": 60.0,
        }
    )
    results = train(cfg, client, stop={"iterations": ITERATIONS})
    last = results[-1]
    # 2 workers x 4 envs x 25 steps per rollout
    assert last["timesteps_total"] >= ITERATIONS * 1_000
    assert last["timesteps_total"] % 100 == 0
    assert last["learner/updates"] > 0 and last["replay/size"] > 0
    assert last["flow/batches_trained"] == last["learner/updates"]
    assert any(r["env/episodes"] > 0 for r in results)  # whole games finished, 8 envs
    evals = [r for r in results if "eval/return_mean" in r]
    assert evals, "no evaluation finished"
    assert all(r["eval/timed_out"] in (0.0, 1.0) for r in evals)
    assert all(math.isfinite(r["eval/return_mean"]) for r in evals if not r["eval/timed_out"])
