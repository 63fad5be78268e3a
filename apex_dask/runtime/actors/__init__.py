"""Dask actors for Ape-X: thin wrappers around the algorithm objects.

Three roles, each created with ``client.submit(Cls, ..., actor=True,
workers=[address])`` and wired by handles (never by moving bulk data through
the driver)::

    shard   = ReplayShardActor(k, capacity, ...)                # replay_shard.py
    learner = LearnerActor(obs_space, act_space, [shards], ...)  # learner.py (+ prefetch.py)
    worker  = EnvWorkerActor(i, env_factory, [shards], learner, ...)  # env_worker.py

    summary = await worker.sample_into(k)   # env worker -> shard k, one hop
    version = await worker.sync_weights()   # learner -> env worker, one hop

Every method is ``async def``. A Dask worker runs the *sync* methods of all
its actors on one thread, so a slow sync method would stall every colocated
actor; async methods run on the worker's event loop and must stay short.
Every actor-to-actor call carries a timeout (:mod:`.calls`): a dead peer
never answers. Each actor publishes its metrics (names from
``docs/metrics.md``) to the scheduler about once a second.
"""

from apex_dask.runtime.actors.env_worker import EnvWorkerActor
from apex_dask.runtime.actors.learner import LearnerActor
from apex_dask.runtime.actors.replay_shard import ReplayShardActor

__all__ = ["EnvWorkerActor", "LearnerActor", "ReplayShardActor"]
