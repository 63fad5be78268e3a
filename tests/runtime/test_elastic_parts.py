"""The parts of elastic runs that need no cluster: slots, placement, a shard handed over.

The shard actors are awaited in this process (as in ``test_actors_in_process.py``):
a handle may be the actor object itself, so the hand-over runs its real code.
"""

from __future__ import annotations

import asyncio

import numpy as np

from apex_dask.algo.exploration import apex_epsilons
from apex_dask.config import ApexConfig
from apex_dask.runtime.actors.replay_shard import ReplayShardActor
from apex_dask.runtime.orchestration.elastic import env_hosts, free_slots, start_placement
from apex_dask.runtime.orchestration.placement import WorkerInfo


def _workers(n: int) -> list[WorkerInfo]:
    return [WorkerInfo(f"tcp://h:{i}", str(i), "h") for i in range(n)]


def test_free_slots_fill_the_fixed_ladder_lowest_index_first():
    assert free_slots({0, 2}, 5, 2) == [1, 3]
    assert free_slots({0, 1, 2}, 3, 4) == []
    assert free_slots(set(), 4, -1) == []


def test_env_workers_live_beside_the_learner_only_when_it_is_alone():
    ws = _workers(3)
    assert [w.name for w in env_hosts(ws, ws[0].address)] == ["1", "2"]
    assert [w.name for w in env_hosts(ws[:1], ws[0].address)] == ["0"]


def test_an_elastic_run_starts_with_per_process_env_workers_per_worker():
    base = ApexConfig.preset("cartpole").override({"workers.num_workers": 5})
    assert len(start_placement(_workers(3), base).env_workers) == 5  # fixed: as configured
    elastic = base.override({"topology.elastic": True, "workers.per_process": 2})
    assert len(start_placement(_workers(2), elastic).env_workers) == 2  # 1 host x 2
    assert len(start_placement(_workers(4), elastic).env_workers) == 5  # 3 x 2, capped
    ladder = apex_epsilons(5, 0.4, 7.0)
    assert ladder[0] > ladder[-1]  # slots filled in order: the greediest come last


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
        await old.update_priorities(sample.indices, np.full(4, 2.0))
        stats = await new.stats()
        assert stats["replay/0/size"] == 40
        assert stats["replay/0/rollouts_stored"] == 4  # counted once, where they are now
        assert stats["replay/0/batches_sampled"] == 2
        assert stats["replay/0/priority_updates_applied"] == 1
        assert (await old.stats())["replay/0/rollouts_stored"] == 3  # frozen at the move

    asyncio.run(go())
