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
from typing import Any

import numpy as np

from apex_dask.algo.envs import EnvFactory, make_env_factory
from apex_dask.algo.exploration import apex_epsilons
from apex_dask.algo.noise import noise_ladder
from apex_dask.algo.replay import ReplayShard
from apex_dask.algo.results import derive_seed
from apex_dask.config import ApexConfig, ConfigError

__all__ = [
    "Hook",
    "build_shards",
    "env_factory",
    "env_worker_kwargs",
    "exploration_ladder",
    "learner_kwargs",
    "resolve_hook",
    "shard_actor_kwargs",
    "shard_kwargs",
]

Hook = Callable[[dict[str, Any], int], dict[str, Any]]


def learner_kwargs(cfg: ApexConfig) -> dict[str, Any]:
    """Keyword arguments of :func:`apex_dask.algo.agents.make_learner` (after the spaces):
    ``algo`` and those of the agent's learner."""
    lc = cfg.learner
    if cfg.algo == "dpg":
        d = cfg.dpg
        return {
            "algo": "dpg",
            "actor_hiddens": d.actor_hiddens,
            "critic_hiddens": d.critic_hiddens,
            "actor_lr": d.actor_lr,
            "critic_lr": d.critic_lr,
            "adam_eps": lc.adam_eps,
            "grad_clip": lc.grad_clip,
            "twin_q": d.twin_q,
            "policy_delay": d.policy_delay,
            "smooth_target_policy": d.smooth_target_policy,
            "target_noise": d.target_noise,
            "target_noise_clip": d.target_noise_clip,
            "tau": d.tau,
            "target_update_freq": lc.target_update_freq,
            "use_huber": d.use_huber,
            "device": lc.device,
            "num_threads": lc.num_threads,
            "seed": derive_seed(cfg.seed, "learner"),
        }
    return {
        "hiddens": lc.hiddens,
        "dueling": lc.dueling,
        "double_q": lc.double_q,
        "lr": lc.lr,
        "adam_eps": lc.adam_eps,
        "grad_clip": lc.grad_clip,
        "target_update_freq": lc.target_update_freq,
        "device": lc.device,
        "num_threads": lc.num_threads,
        "seed": derive_seed(cfg.seed, "learner"),
        "amp": lc.amp,
        "compile": lc.compile,
        "memory_format": lc.memory_format,
    }


def env_worker_kwargs(cfg: ApexConfig) -> dict[str, Any]:
    """Keyword arguments every env worker of :func:`apex_dask.algo.agents.make_env_worker`
    shares (each adds its own ``epsilon`` and ``seed``)."""
    lc, d = cfg.learner, cfg.dpg
    dpg = {
        "actor_hiddens": d.actor_hiddens,
        "critic_hiddens": d.critic_hiddens,
        "twin_q": d.twin_q,
        "noise": d.noise,
        "ou_theta": d.ou_theta,
    }
    return {
        "algo": cfg.algo,
        "dpg": dpg if cfg.algo == "dpg" else None,
        "n_step": lc.n_step,
        "gamma": lc.gamma,
        "fragment_length": cfg.workers.rollout_fragment_length,
        "hiddens": lc.hiddens,
        "dueling": lc.dueling,
        "double_q": lc.double_q,
        "frame_stack": cfg.replay.frame_stack,
        "num_envs": cfg.workers.envs_per_worker,
        "vector_mode": cfg.workers.vector_mode,
        "make_timeout_s": cfg.env.make_timeout_s,
        "step_timeout_s": cfg.env.step_timeout_s,
        "restart_failed_envs": cfg.workers.restart_failed_envs,
        "max_env_errors_per_1k_steps": cfg.workers.max_env_errors_per_1k_steps,
        "max_consecutive_env_errors": cfg.workers.max_consecutive_env_errors,
    }


def exploration_ladder(cfg: ApexConfig, num_workers: int | None = None) -> np.ndarray:
    """Each env worker's exploration: its epsilon (``dqn``) or noise scale sigma (``dpg``),
    decreasing with the worker's index (metrics follow the last third)."""
    n = cfg.workers.num_workers if num_workers is None else num_workers
    if cfg.algo == "dpg":
        return noise_ladder(n, cfg.dpg.noise_base, cfg.dpg.noise_alpha)
    return apex_epsilons(n, cfg.workers.epsilon_base, cfg.workers.epsilon_alpha)


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
