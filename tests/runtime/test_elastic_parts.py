"""The parts of elastic runs that need no cluster: slots, placement, a shard handed over.

The shard actors are awaited in this process (as in ``test_actors_in_process.py``):
a handle may be the actor object itself, so the hand-over runs its real code.
"""

from __future__ import annotations

import asyncio

import numpy as np

from apex_dask.algo.agents.r2d2.config import R2D2Config
from apex_dask.algo.agents.r2d2.worker import R2D2EnvWorker
from apex_dask.algo.envs.factory import make_env_factory
from apex_dask.algo.envs.pomdp import POMDP_CARTPOLE_ID
from apex_dask.algo.replay.storage import GENERATION_EPOCH
from apex_dask.algo.rollout.exploration import apex_epsilons
from apex_dask.algo.rollout.spec import RolloutSpec
from apex_dask.config import ApexConfig
from apex_dask.runtime.actors.replay_shard import ReplayShardActor
from apex_dask.runtime.orchestration.elastic import env_hosts, free_slots, start_placement
from apex_dask.runtime.orchestration.placement import WorkerInfo


def _workers(n: int) -> list[WorkerInfo]:
    return [WorkerInfo(f"tcp://h:{i}", str(i), "h") for i in range(n)]


def test_free_slots_fill_the_fixed_ladder_ends_first_then_the_widest_gaps():
    assert free_slots(set(), 5, 2) == [0, 4]  # as 2 workers of a 2-slot ladder
    assert free_slots({0, 4}, 5, 2) == [2, 1]
    assert free_slots({0, 2}, 5, 2) == [4, 1]  # a retired slot is the next to refill
    assert free_slots({0, 1, 2}, 3, 4) == []
    assert free_slots(set(), 4, -1) == []


def test_env_workers_live_beside_the_learner_only_when_it_is_alone():
    ws = _workers(3)
    assert [w.name for w in env_hosts(ws, ws[0].address)] == ["1", "2"]
    assert [w.name for w in env_hosts(ws[:1], ws[0].address)] == ["0"]


def _slots(placement) -> list[int]:
    return [i for i, w in enumerate(placement.env_workers) if w is not None]


def test_an_elastic_run_starts_with_per_process_env_workers_per_worker():
    base = ApexConfig.preset("cartpole").override({"workers.num_workers": 5})
    assert _slots(start_placement(_workers(3), base)) == [0, 1, 2, 3, 4]  # fixed: as configured
    elastic = base.override({"topology.elastic": True, "workers.per_process": 2})
    two = start_placement(_workers(2), elastic)  # 1 host x 2: both ends of the ladder
    assert _slots(two) == [0, 4] and len(two.env_workers) == 5
    assert {w.name for w in two.env_workers if w} == {"1"}  # not beside the learner
    assert _slots(start_placement(_workers(4), elastic)) == [0, 1, 2, 3, 4]  # 3 x 2, capped


def test_the_quickstart_on_2_cores_acts_with_the_2_worker_ladder():
    """The notebook's elastic config (per_process 2, num_workers 4) on 2 worker processes
    starts the env workers, epsilons and placement of the cartpole preset's fixed 2."""
    old = ApexConfig.preset("cartpole")
    new = old.override(
        {"topology.elastic": True, "workers.per_process": 2, "workers.num_workers": 4}
    )
    was, now = start_placement(_workers(2), old), start_placement(_workers(2), new)
    ladder = apex_epsilons(4, 0.4, 7.0)
    assert [ladder[i] for i in _slots(now)] == list(apex_epsilons(2, 0.4, 7.0))
    assert [w for w in now.env_workers if w] == was.env_workers
    assert (now.learner, now.shards, now.evaluator) == (was.learner, was.shards, was.evaluator)


def _batch(n: int, start: float) -> dict[str, np.ndarray]:
    obs = np.arange(start, start + n, dtype=np.float32)[:, None].repeat(4, axis=1)
    return {
        "obs": obs,
        "action": np.zeros(n, np.int64),
        "reward": np.ones(n, np.float32),
        "next_obs": obs + 1,
        "done": np.zeros(n, np.float32),
    }


def test_a_handed_over_shard_loses_nothing_and_forwards_late_calls():
    async def go() -> None:
        kw = {"alpha": 0.6, "learning_starts": 8, "batch_size": 4, "seed": 1}
        old, new = ReplayShardActor(0, 100, **kw), ReplayShardActor(0, 100, **kw)
        for i in range(3):
            await old.add(_batch(10, 10.0 * i), np.ones(10))
        await old.sample()
        before, after = await new.take_over(old, new)
        assert before == after == 30
        await old.add(_batch(10, 30.0), np.ones(10))  # a rollout already on its way
        sample = await old.sample()  # a request already on its way: served by the new one
        assert sample is not None and sample.shard_id == 0
        stale = await old.update_priorities(sample.indices, np.full(4, 2.0), sample.generations)
        assert stale == 0  # the items moved with their generations
        gone = await new.sample()  # then the new shard overwrites the ring: 40 + 60 > 100
        for i in range(6):
            await new.add(_batch(10, 100.0 + 10 * i), np.ones(10))
        assert await old.update_priorities(gone.indices, np.ones(4), gone.generations) == sum(
            int(i) < 40 + 60 - 100 for i in gone.indices
        )
        stats = await new.stats()
        assert stats["replay/0/size"] == 100
        assert stats["replay/0/rollouts_stored"] == 10  # counted once, where they are now
        assert stats["replay/0/batches_sampled"] == 3
        assert stats["replay/0/priority_updates_applied"] == 2
        assert (await old.stats())["replay/0/rollouts_stored"] == 3  # frozen at the move

    asyncio.run(go())


def test_r2d2_sequence_items_handed_over_arrive_bit_identical_and_sample_as_sent():
    """A shard of R2D2 sequence items (built by the agent's worker from a real POMDP
    CartPole, across fragment boundaries and episode ends) handed over: the new
    shard's contents equal the old one's array for array, and a batch sampled through
    the old handle (forwarded) holds exactly the items added at those slots."""
    options = R2D2Config(hiddens=(16,), lstm_size=8, burn_in=4, trace_length=6, period=3)
    worker = R2D2EnvWorker(
        make_env_factory(POMDP_CARTPOLE_ID),
        epsilon=0.5,
        seed=3,
        rollout=RolloutSpec(fragment_length=17, num_envs=2),
        config=options,
    )
    rollouts = [worker.sample() for _ in range(6)]
    sent = {k: np.concatenate([r.batch[k] for r in rollouts]) for k in rollouts[0].batch}
    n = len(sent["action"])
    assert n > 8 and sent["obs"].shape[1:] == (10, 2) and sent["state"].shape[1:] == (2, 8)
    assert (sent["mask"] == 0).any()  # some items end padded at an episode's end

    async def go() -> None:
        kw = {"alpha": 0.9, "learning_starts": 1, "batch_size": 8, "seed": 1}
        old, new = ReplayShardActor(0, 4 * n, **kw), ReplayShardActor(0, 4 * n, **kw)
        for r in rollouts:
            await old.add(r.batch, r.priorities)
        held = await old.state_dict()
        assert await new.take_over(old, new) == (n, n)
        moved = await new.state_dict()
        assert held.keys() == moved.keys()
        # a restore moves the write clock on by design (storage.GENERATION_EPOCH), so a
        # priority update sent before the move is told apart from a later item's; every
        # item's own generation, data and priority move as they were
        assert moved.pop("clock") >= held.pop("clock") + GENERATION_EPOCH
        for k in held:
            np.testing.assert_array_equal(np.asarray(held[k]), np.asarray(moved[k]), err_msg=k)
        sample = await old.sample()  # forwarded to the new shard
        assert sample is not None and set(sample.data) >= set(sent)
        for k, v in sent.items():
            np.testing.assert_array_equal(sample.data[k], v[sample.indices], err_msg=k)

    asyncio.run(go())
