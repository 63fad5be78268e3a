"""What an env worker's rollouts are made of, whatever the agent: the settings and the result.

:class:`RolloutSpec` travels once per run from the config to every env worker
(inside the agent's :class:`~apex_dask.algo.agents.spec.WorkerSpec`);
:class:`Rollout` is what one :meth:`~apex_dask.algo.rollout.worker.ActingWorker.sample`
gives back: the busy hop from the acting loop to the replay shard and the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["VECTOR_MODES", "Rollout", "RolloutSpec"]

VECTOR_MODES = ("native", "sync")
"""How a worker steps its envs: ``native`` (ALE games: ale-py's ``AtariVectorEnv``,
:mod:`apex_dask.algo.envs.native`; other envs as ``sync``) or ``sync`` (gymnasium envs
stepped in turn, :class:`~apex_dask.algo.envs.sync.GuardedEnvs`)."""


@dataclass(frozen=True)
class RolloutSpec:
    """How every env worker of a run steps its envs and cuts its rollouts: the config keys
    each field comes from (``experiment.builder.worker_spec``), documented there. The
    defaults are written once, here: those keys' defaults are these."""

    n_step: int = 3
    """``learner.n_step``."""
    gamma: float = 0.99
    """``learner.gamma``."""
    fragment_length: int = 50
    """``workers.rollout_fragment_length`` (vector steps: of every env of the worker)."""
    num_envs: int = 1
    """``workers.envs_per_worker``."""
    vector_mode: str = "sync"
    """``workers.vector_mode``: one of :data:`VECTOR_MODES`."""
    frame_stack: int | None = None
    """``replay.frame_stack``."""
    make_timeout_s: float = 60.0
    """``env.make_timeout_s``."""
    step_timeout_s: float | None = None
    """``env.step_timeout_s``."""
    restart_failed_envs: bool = True
    """``workers.restart_failed_envs``."""
    max_env_errors_per_1k_steps: int = 10
    """``workers.max_env_errors_per_1k_steps``."""
    max_consecutive_env_errors: int = 5
    """``workers.max_consecutive_env_errors``."""


@dataclass(frozen=True)
class Rollout:
    """One rollout: its transitions and what the driver hears of it.

    ``batch``: ``obs, action, reward, next_obs, done, discount`` arrays (with
    ``frame_stack``: ``frames, obs_refs, action, reward, next_obs_refs, done,
    discount``); ``priorities``: float32 |td| per item, or None (the shard gives each
    item its largest priority so far); ``steps``: env steps
    made; the episodes that ended in it; the weights version it acted with; the
    worker's exploration parameter (its agent's: an epsilon, DPG's noise scale).
    """

    batch: dict[str, np.ndarray]
    priorities: np.ndarray | None
    steps: int
    weights_version: int
    exploration: float
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.batch["action"])
