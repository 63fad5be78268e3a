"""Simulated env workers (``simulate.env_steps_per_s``): many actors per process through the
real driver, shards and learner, and the shards hold exactly the rollouts offered."""

from __future__ import annotations

import numpy as np
import pytest

from apex_dask.algo.rollout.simulated import read_stamps
from apex_dask.config import ApexConfig, ConfigError
from apex_dask.runtime.orchestration.driver import ApexDriver

pytestmark = pytest.mark.slow  # a LocalCluster and a short training run

FRAGMENT = 20


def test_bad_rate_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"simulate\.env_steps_per_s=0\.0 is invalid"):
        ApexConfig.preset("cartpole").override({"simulate.env_steps_per_s": 0.0})


def test_stored_rollouts_are_exactly_the_offered_ones() -> None:
    cfg = ApexConfig.preset("cartpole").override(
        {
            "simulate.env_steps_per_s": 400.0,
            "workers.num_workers": 24,  # 12 per env-worker process
            "workers.rollout_fragment_length": FRAGMENT,
            "replay.num_shards": 2,
            "replay.capacity": 400_000,  # nothing is overwritten
            "replay.learning_starts": 400,
            "eval.episodes": 0,
            "report.min_iter_time_s": 1.0,
            "report.timesteps_per_iteration": 0,
            "topology.local_workers": 3,
            "seed": 11,
        }
    )
    with ApexDriver(cfg) as driver:
        results = driver.run(stop={"iterations": 3})
        final = driver.halt()
        shards = driver.replay_contents()
        transport = driver.env_transport()
    sent = {t["index"]: t["rollouts_sent"] for t in transport}
    assert len(sent) == 24 and len({t["address"] for t in transport}) == 2  # 12 per process
    latencies = [x for t in transport for x in t["store_s"]]
    assert len(latencies) == sum(sent.values()) and min(latencies) >= 0
    assert results[-1]["learner/steps_trained"] > 0  # the learner trained on them
    assert final["flow/rollouts_sent"] == final["flow/rollouts_stored"] == sum(sent.values())
    assert min(sent.values()) > 0

    stamps = np.concatenate([read_stamps({"obs": s["data/obs"]}) for s in shards])
    rewards = np.concatenate([s["data/reward"] for s in shards])
    actions = np.concatenate([s["data/action"] for s in shards])
    # every item of every rollout offered, each once, and nothing else
    offered = {(i, j, p) for i, n in sent.items() for j in range(n) for p in range(FRAGMENT)}
    got = [tuple(int(x) for x in row) for row in stamps]
    assert len(got) == len(offered) == len(set(got))
    assert set(got) == offered
    # each worker's rollouts carry its template's contents, intact, at each place
    for i in sent:
        mine = stamps[:, 0] == i
        for col in (rewards[mine], actions[mine]):
            by_place = {}
            for p, value in zip(stamps[mine, 2], col, strict=True):
                by_place.setdefault(int(p), set()).add(value.item())
            assert all(len(v) == 1 for v in by_place.values())
