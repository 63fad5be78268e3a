import math

import numpy as np
import pytest

from apex_dask.algo.replay.shard import ReplayShard
from apex_dask.experiment.flow import ShardFlow
from apex_dask.experiment.results import shard_metrics
from apex_dask.experiment.stats import (
    derive_seed,
    episode_metrics,
    window_stat_metrics,
)
from apex_dask.experiment.timers import WindowStat


def test_derive_seed_is_stable_and_distinct_per_component():
    seeds = {derive_seed(0, r, i) for r in ("learner", "worker", "shard", "eval") for i in range(5)}
    assert len(seeds) == 20
    assert derive_seed(7, "worker", 3) == derive_seed(7, "worker", 3)
    assert derive_seed(7, "worker", 3) != derive_seed(8, "worker", 3)
    assert all(0 <= s < 2**31 for s in seeds)
    with pytest.raises(ValueError):
        derive_seed(0, "nope")


def test_episode_metrics_means_and_nan_when_empty():
    m = episode_metrics([10.0, 20.0, 60.0], [10, 20, 60])
    assert m == {
        "env/episode_return_mean": 30.0,
        "env/episode_len_mean": 30.0,
        "env/episodes": 3.0,
    }
    empty = episode_metrics([], [])
    assert math.isnan(empty["env/episode_return_mean"]) and empty["env/episodes"] == 0.0


def test_window_stat_flattens_to_named_quantiles():
    w = WindowStat("learner/queue_size", n=5)
    for x in [4, 0, 2, 1, 3]:
        w.push(x)
    m = window_stat_metrics("learner/queue_size", w.stats())
    assert m["learner/queue_size"] == 2.0
    assert m["learner/queue_size/q0"] == 0.0 and m["learner/queue_size/q100"] == 4.0
    assert m["learner/queue_size/q50"] == 2.0
    assert set(m) == {
        "learner/queue_size",
        "learner/queue_size/std",
        *(f"learner/queue_size/q{q}" for q in (0, 10, 50, 90, 100)),
    }


def test_replay_metrics_cover_every_shard():
    shards = [ReplayShard(8, seed=0), ReplayShard(8, seed=1)]
    batch = {
        "obs": np.zeros((5, 2), np.float32),
        "action": np.zeros(5, np.int64),
        "reward": np.zeros(5, np.float32),
        "next_obs": np.zeros((5, 2), np.float32),
        "done": np.zeros(5, bool),
    }
    shards[0].add(batch)
    shards[1].add(batch)
    shards[1].add(batch)
    shards[1].sample(3, 0.4)
    m = {}
    for k, shard in enumerate(shards):
        counters = {"rollouts_stored": k + 1, "batches_sampled": k, "priority_updates_applied": 0}
        m.update(shard_metrics(k, shard.stats(), ShardFlow(**counters)))
    assert m["replay/0/size"] == 5 and m["replay/1/size"] == 8
    assert m["replay/1/added"] == 10 and m["replay/1/evicted"] == 2
    assert m["replay/1/sampled"] == 3 and m["replay/1/rollouts_stored"] == 2
    assert "replay/0/sample_s" in m and m["replay/1/bytes"] >= m["replay/0/bytes"] > 0
