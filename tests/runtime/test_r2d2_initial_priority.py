"""R2D2's initial priorities on the way to a shard: with ``initial_priority="max"`` (the
default) the env worker actor sends none and the shard gives every new sequence its
largest priority so far; with ``"worker"`` the worker's own scores arrive as computed.
The actors run in this process, as in ``test_actors_in_process.py`` (the same objects a
Dask worker runs)."""

from __future__ import annotations

import asyncio
import pickle

import numpy as np
import pytest
from agent_parts import CPU

from apex_dask.algo.agents.r2d2.config import R2D2Config
from apex_dask.algo.agents.r2d2.learner import R2D2Learner
from apex_dask.algo.agents.r2d2.worker import R2D2EnvWorker
from apex_dask.algo.agents.spec import AgentSpec, WorkerSpec
from apex_dask.algo.envs.factory import make_env_factory
from apex_dask.algo.envs.pomdp import POMDP_CARTPOLE_ID
from apex_dask.algo.envs.probe import probe_spaces
from apex_dask.algo.rollout.spec import RolloutSpec
from apex_dask.runtime.actors import EnvWorkerActor, ReplayShardActor

ROLLOUT = RolloutSpec(n_step=3, fragment_length=20, num_envs=2)


def _options(mode: str) -> R2D2Config:
    return R2D2Config(
        hiddens=(16,), lstm_size=8, burn_in=4, trace_length=6, period=3, initial_priority=mode
    )


def test_the_default_is_the_shards_max_priority():
    assert R2D2Config().initial_priority == "max"
    assert R2D2Config().check() is None
    assert R2D2Config(initial_priority="mean").check()[0] == "initial_priority"


@pytest.mark.parametrize("mode", ["max", "worker"])
def test_new_sequences_reach_the_shard_with_the_chosen_priority(mode):
    factory = make_env_factory(POMDP_CARTPOLE_ID)
    options = _options(mode)
    obs_space, act_space = probe_spaces(factory)
    version, weights = R2D2Learner(obs_space, act_space, options, CPU, seed=1).get_weights()
    # the shard already holds items of priority 7 (a larger max than the initial 1)
    seeder = R2D2EnvWorker(factory, epsilon=0.5, seed=9, rollout=ROLLOUT, config=_options("worker"))
    first = seeder.sample()
    seeder.close()
    shard = ReplayShardActor(0, 1024, batch_size=4, seed=0, alpha=1.0)
    spec = WorkerSpec(AgentSpec("r2d2", options), ROLLOUT)

    class Source:  # the learner actor's weights_if_newer
        async def weights_if_newer(self, have: int) -> bytes | None:
            return pickle.dumps((version, weights)) if version > have else None

    worker = EnvWorkerActor(0, factory, [shard], Source(), spec, exploration=0.3, seed=3)

    async def scenario():
        await shard.add(first.batch, np.full(len(first), 7.0, np.float32))
        await worker.sync_weights()
        summary = await worker.sample_into(0)
        state = await shard.state_dict()
        await worker.close()
        return summary, state

    summary, state = asyncio.run(scenario())
    assert summary.rollouts == 1
    n0 = len(first)
    got = np.asarray(state["priority"])[n0:]
    assert len(got) > 0 and np.array_equal(np.asarray(state["priority"])[:n0], np.full(n0, 7.0))
    if mode == "max":
        np.testing.assert_allclose(got, 7.0)  # the shard's max, nothing from the worker
    else:
        assert np.all(got > 0) and not np.allclose(got, 7.0)  # the worker's own scores
        assert len(np.unique(got)) > 1
