"""What each Ape-X component is built with, read from the one config tree.

Both runners (:mod:`apex_dask.local` in one process,
:mod:`apex_dask.runtime.orchestration.driver` on Dask) build the same
learner, replay shards and env workers; these functions are the one place
that maps :class:`~apex_dask.config.ApexConfig` fields to the components'
explicit arguments. The runners add only what differs per instance
(epsilon, seed) or per runtime (timeouts, run id, placement).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from apex_dask.algo.agents.builder import AgentBuilder
from apex_dask.algo.agents.registry import agent
from apex_dask.algo.agents.spec import AgentSpec, WorkerSpec
from apex_dask.algo.envs.factory import EnvFactory, make_env_factory
from apex_dask.algo.rollout.spec import RolloutSpec
from apex_dask.config import ApexConfig, ConfigError
from apex_dask.experiment.stats import derive_seed

if TYPE_CHECKING:
    from apex_dask.algo.replay.shard import ReplayShard

__all__ = [
    "Hook",
    "agent_of",
    "agent_spec",
    "build_shards",
    "env_factory",
    "exploration_ladder",
    "learner_seed",
    "resolve_hook",
    "shard_actor_kwargs",
    "shard_kwargs",
    "worker_spec",
]

Hook = Callable[[dict[str, Any], int], dict[str, Any]]


def agent_of(cfg: ApexConfig) -> AgentBuilder:
    """The builder of the run's agent (``cfg.algo``, looked up in the registry)."""
    return agent(cfg.algo)


def agent_spec(cfg: ApexConfig) -> AgentSpec:
    """The run's agent with its own section and the shared ``learner`` one: what the
    learner, the env workers, evaluation and export are built with."""
    return agent_of(cfg).agent_spec(cfg)


def learner_seed(cfg: ApexConfig) -> int:
    """The seed of the learner's initial weights."""
    return derive_seed(cfg.seed, "learner")


def worker_spec(cfg: ApexConfig) -> WorkerSpec:
    """What every env worker of the run is built with (each adds its epsilon and seed)."""
    w, lc, ec = cfg.workers, cfg.learner, cfg.env
    rollout = RolloutSpec(
        n_step=lc.n_step,
        gamma=lc.gamma,
        fragment_length=w.rollout_fragment_length,
        num_envs=w.envs_per_worker,
        vector_mode=w.vector_mode,
        frame_stack=cfg.replay.frame_stack,
        make_timeout_s=ec.make_timeout_s,
        step_timeout_s=ec.step_timeout_s,
        restart_failed_envs=w.restart_failed_envs,
        max_env_errors_per_1k_steps=w.max_env_errors_per_1k_steps,
        max_consecutive_env_errors=w.max_consecutive_env_errors,
    )
    return WorkerSpec(agent_spec(cfg), rollout)


def exploration_ladder(cfg: ApexConfig, num_workers: int | None = None) -> np.ndarray:
    """Each env worker's exploration parameter (its agent's: an epsilon, DPG's noise
    scale), decreasing with the worker's index (metrics follow the last third)."""
    n = cfg.workers.num_workers if num_workers is None else num_workers
    return agent_of(cfg).exploration_ladder(cfg, n)


def env_factory(cfg: ApexConfig) -> EnvFactory:
    """The checked, picklable factory of the env every env worker and evaluator makes."""
    ec = cfg.env
    return make_env_factory(
        ec.env_id,
        ec.env_kwargs,
        clip_rewards=ec.clip_rewards,
        repeat_action_probability=ec.repeat_action_probability,
    )


def shard_kwargs(cfg: ApexConfig, shard_id: int) -> dict[str, Any]:
    """Keyword arguments of replay shard ``shard_id``'s :class:`ReplayShard`."""
    rc = cfg.replay
    return {
        "capacity": rc.shard_capacity,
        "alpha": rc.alpha,
        "eps": rc.eps,
        "seed": derive_seed(cfg.seed, "shard", shard_id),
        "frame_stack": rc.frame_stack,
    }


def shard_actor_kwargs(cfg: ApexConfig, shard_id: int) -> dict[str, Any]:
    """:func:`shard_kwargs` plus what the shard actor serves batches with."""
    return {
        **shard_kwargs(cfg, shard_id),
        "beta": cfg.replay.beta,
        "learning_starts": cfg.replay.shard_learning_starts,
        "batch_size": cfg.learner.batch_size,
        # every sample request in flight, plus the batches queued and in training
        "shared_slots": cfg.learner.prefetch_per_shard + 4,
    }


def build_shards(cfg: ApexConfig) -> list[ReplayShard]:
    """The ``replay.num_shards`` shards of an in-process run."""
    from apex_dask.algo.replay.shard import ReplayShard  # numba: only where shards are made

    return [ReplayShard(**shard_kwargs(cfg, k)) for k in range(cfg.replay.num_shards)]


def resolve_hook(cfg: ApexConfig, hook: Hook | None = None) -> Hook | None:
    """The ``before_learn_on_batch`` hook: ``hook`` if given, else the config's import path.

    Raises :class:`ConfigError` (one line) when the path cannot be imported or
    does not name a callable.
    """
    if hook is not None:
        return hook
    path = cfg.learner.before_learn_on_batch
    if path is None:
        return None
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"learner.before_learn_on_batch={path!r}: cannot import {module_name!r} ({exc}); "
            "is it on PYTHONPATH of the driver and the workers?"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(
            f"learner.before_learn_on_batch={path!r}: {module_name} has no function {attr!r}"
        )
    return fn
