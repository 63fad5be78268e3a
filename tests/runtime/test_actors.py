"""ReplayShardActor, LearnerActor and EnvWorkerActor on a real 2-process LocalCluster."""

from __future__ import annotations

import time

import numpy as np
import pytest
from polling import poll

from apex_dask.algo.agents.config import LearnerConfig
from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.spec import AgentSpec, WorkerSpec
from apex_dask.algo.envs.factory import make_env_factory
from apex_dask.algo.envs.probe import probe_spaces
from apex_dask.algo.rollout.spec import RolloutSpec
from apex_dask.runtime.actors import EnvWorkerActor, LearnerActor, ReplayShardActor

pytestmark = pytest.mark.slow  # every test uses the module's 2-process LocalCluster

OBS = 4
AGENT = AgentSpec(
    "dqn", DQNConfig(hiddens=(32,)), LearnerConfig(target_update_freq=10_000, device="cpu")
)


def rollout(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "obs": rng.normal(size=(n, OBS)).astype(np.float32),
        "action": rng.integers(0, 2, size=n).astype(np.int64),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.normal(size=(n, OBS)).astype(np.float32),
        "done": np.zeros(n, np.float32),
        "discount": np.full(n, 0.97, np.float32),
    }


@pytest.fixture(scope="module")
def spaces():
    return probe_spaces(make_env_factory("CartPole-v1"))


def make_shard(client, where, shard_id, *, learning_starts=0, batch_size=16, capacity=4096):
    return client.submit(
        ReplayShardActor,
        shard_id,
        capacity,
        learning_starts=learning_starts,
        batch_size=batch_size,
        seed=shard_id,
        actor=True,
        workers=[where],
    )


def make_learner(client, where, spaces, shard_futures, **kwargs):
    kwargs.setdefault("batch_size", 16)
    return client.submit(
        LearnerActor,
        *spaces,
        shard_futures,
        agent=AGENT,
        call_timeout_s=20.0,
        actor=True,
        workers=[where],
        **kwargs,
    )


def test_shard_returns_none_until_it_holds_learning_starts_items(client, worker_addresses):
    rng = np.random.default_rng(0)
    fut = make_shard(client, worker_addresses[0], 3, learning_starts=100, batch_size=8)
    shard = fut.result()
    assert shard.add(rollout(64, rng)).result() == 64
    assert shard.sample().result() is None
    assert shard.add(rollout(64, rng), np.ones(64, np.float32)).result() == 128
    out = shard.sample().result()
    assert out.shard_id == 3 and out.added == 128
    assert out.indices.shape == (8,) and out.indices.dtype == np.int64
    assert out.weights.dtype == np.float32 and np.all(out.weights <= 1.0)
    assert out.data["obs"].shape == (8, OBS)
    stats = shard.stats().result()
    assert stats["replay/3/size"] == 128
    assert stats["replay/3/rollouts_stored"] == 2
    assert stats["replay/3/batches_sampled"] == 1


def test_full_inqueue_makes_the_prefetcher_wait_counts_it_and_drops_nothing(
    client, worker_addresses, spaces
):
    rng = np.random.default_rng(1)
    shard_futs = [make_shard(client, worker_addresses[0], k) for k in range(2)]
    for f in shard_futs:
        f.result().add(rollout(256, rng)).result()

    def slow_hook(batch, shard_id):  # a learner slower than replay: the queue fills
        time.sleep(0.02)
        return batch

    learner = make_learner(
        client,
        worker_addresses[0],
        spaces,
        shard_futs,
        inqueue_size=2,
        prefetch_per_shard=2,
        before_learn_on_batch=slow_hook,
    ).result()
    learner.start().result()

    def producers_blocked():
        stats = learner.stats().result()
        return stats["learner/enqueue_blocked_s"] > 0.5 and stats["flow/batches_trained"] > 10

    poll(producers_blocked, timeout_s=60)
    final = learner.stop().result()
    shards = [f.result().stats().result() for f in shard_futs]
    sampled = sum(s[f"replay/{k}/batches_sampled"] for k, s in enumerate(shards))
    applied = sum(s[f"replay/{k}/priority_updates_applied"] for k, s in enumerate(shards))

    assert final["learner/enqueue_blocked_s"] > 0.5  # producers waited most of the time
    assert final["learner/hook_calls"] == final["flow/batches_trained"] > 10
    assert final["flow/batches_lost"] == 0
    assert final["flow/batches_received"] == sampled
    assert final["flow/batches_trained"] == sampled - final["flow/batches_in_queue"]
    assert final["flow/priority_updates_sent"] == final["flow/batches_trained"] == applied
    assert final["learner/queue_size/q100"] <= 2


def test_stats_asked_mid_training_count_each_batch_with_its_update(
    client, worker_addresses, spaces
):
    # a learner's stats may be asked between an update and the count of its batch: both
    # sides come from the same step (a result that counted one and not the other broke
    # the flow law ``flow/batches_trained == learner/updates`` in a run's rows)
    rng = np.random.default_rng(4)
    shard_fut = make_shard(client, worker_addresses[0], 0)
    shard_fut.result().add(rollout(512, rng)).result()
    learner = make_learner(client, worker_addresses[0], spaces, [shard_fut]).result()
    learner.start().result()
    reads = [learner.stats().result() for _ in range(300)]
    final = learner.stop().result()
    mid = [r for r in reads if 0 < r["flow/batches_trained"] < final["flow/batches_trained"]]
    assert len(mid) > 100, len(mid)  # read while training
    for r in reads:
        updates = r["learner/updates"]
        assert r["flow/batches_trained"] == updates == r["learner/version"], r
        assert r["learner/steps_trained"] == 16 * updates, r


def test_priorities_go_back_to_the_shard_that_sampled_the_batch(client, worker_addresses, spaces):
    rng = np.random.default_rng(2)
    # Shard 0 holds 2000 items, shard 1 only 40: indices from shard 0 sent to
    # shard 1 would be out of range there and fail.
    shard_futs = [make_shard(client, worker_addresses[0], k) for k in range(2)]
    shard_futs[0].result().add(rollout(2000, rng)).result()
    shard_futs[1].result().add(rollout(40, rng)).result()
    learner = make_learner(client, worker_addresses[1], spaces, shard_futs).result()
    learner.start().result()

    def both_shards_updated():
        stats = [f.result().stats().result() for f in shard_futs]
        return all(s[f"replay/{k}/priority_updates_applied"] > 0 for k, s in enumerate(stats))

    poll(both_shards_updated, timeout_s=60)
    final = learner.stop().result()
    shards = [f.result().stats().result() for f in shard_futs]

    assert final["flow/priority_updates_failed"] == 0
    for k, s in enumerate(shards):
        assert s[f"replay/{k}/batches_sampled"] > 0
        assert s[f"replay/{k}/priority_updates_applied"] == s[f"replay/{k}/batches_sampled"]
    # the shard's largest priority moved off the initial 1.0
    state = shard_futs[0].result().state_dict().result()
    assert float(state["max_priority"]) != 1.0

    # a stopped learner starts again and keeps the counts consistent
    learner.start().result()
    poll(lambda: learner.stats().result()["flow/batches_trained"] > final["flow/batches_trained"])
    again = learner.stop().result()
    assert again["flow/batches_trained"] > final["flow/batches_trained"]
    assert again["flow/batches_received"] == (
        again["flow/batches_trained"] + again["flow/batches_in_queue"]
    )


def test_max_replay_ratio_bounds_batches_by_items_added(client, worker_addresses, spaces):
    rng = np.random.default_rng(3)
    shard_fut = make_shard(client, worker_addresses[0], 0)
    shard_fut.result().add(rollout(160, rng)).result()  # ratio 2 -> at most 2 * 160 / 16 = 20
    learner = make_learner(
        client, worker_addresses[0], spaces, [shard_fut], max_replay_ratio=2.0
    ).result()
    learner.start().result()

    def capped():  # 20 batches taken and the gate has made the learner wait
        stats = learner.stats().result()
        return stats["flow/batches_received"] >= 20 and stats["learner/ratio_wait_s"] > 0 and stats

    mid = poll(capped, timeout_s=60)
    shard_fut.result().add(rollout(160, rng)).result()  # room for 20 more
    poll(lambda: learner.stats().result()["flow/batches_received"] >= 40, timeout_s=60)
    final = learner.stop().result()

    assert mid["flow/batches_received"] == 20
    assert final["flow/batches_received"] == 40
    assert final["learner/ratio_wait_s"] > 0


def test_env_worker_stores_rollouts_in_the_chosen_shard_and_syncs_newer_weights(
    client, worker_addresses, spaces
):
    shard_futs = [make_shard(client, worker_addresses[0], k, learning_starts=10**6) for k in (0, 1)]
    learner_fut = make_learner(client, worker_addresses[0], spaces, shard_futs)
    env = client.submit(
        EnvWorkerActor,
        5,
        make_env_factory("CartPole-v1"),
        shard_futs,
        learner_fut,
        WorkerSpec(AGENT, RolloutSpec(n_step=3, gamma=0.99, fragment_length=20)),
        exploration=0.3,
        seed=5,
        call_timeout_s=20.0,
        actor=True,
        workers=[worker_addresses[1]],
    ).result()

    summaries = [env.sample_into(1).result() for _ in range(3)]
    s0 = shard_futs[0].result().stats().result()
    s1 = shard_futs[1].result().stats().result()
    assert s0["replay/0/size"] == 0
    assert s1["replay/1/rollouts_stored"] == 3
    steps = sum(s.steps for s in summaries)
    assert steps - 2 <= s1["replay/1/size"] <= steps  # up to n-1 steps still pending
    assert [s.rollouts for s in summaries] == [1, 1, 1]
    assert summaries[0].weights_version == -1

    learner = learner_fut.result()
    blobs = [learner.weights_if_newer(-1) for _ in range(3)]  # three asks, one version
    assert len({b.result() for b in blobs}) == 1
    assert learner.stats().result()["learner/weight_snapshots"] == 1  # serialized once
    assert env.sync_weights().result() == 0  # the learner's initial weights
    assert env.sync_weights().result() is None  # nothing newer
    assert env.sample_into(0).result().weights_version == 0
    stats = env.stats().result()
    assert stats["env/epsilon/5"] == 0.3
    assert stats["env/5/rollouts_sent"] == 4
    # several rollouts per call: one per shard id, one summary for them all
    batched = env.sample_into([0, 1, 1]).result()
    assert batched.rollouts == 3 and batched.steps == 3 * 20
    assert shard_futs[0].result().stats().result()["replay/0/rollouts_stored"] == 2
    assert shard_futs[1].result().stats().result()["replay/1/rollouts_stored"] == 5
    assert env.stats().result()["env/5/rollouts_sent"] == 7
