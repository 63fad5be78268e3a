"""The two Ape-X agents behind one interface: ``dqn`` (discrete actions) and ``dpg`` (continuous).

Runners and actors build the learner and the env workers through these two
functions, so the plan (store, replay, update, report) is the same for both::

    learner = make_learner(obs_space, act_space, algo="dpg", **kwargs)
    worker = make_env_worker(factory, algo="dpg", epsilon=sigma_i, seed=1, dpg={...})

For ``dpg`` the per-worker ``epsilon`` is the worker's noise scale sigma_i
(:mod:`apex_dask.algo.noise`), and the DQN network keys (``hiddens``,
``dueling``, ``double_q``, ``frame_stack``, ``vector_mode``) are not used: its
networks come from the ``dpg`` dict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gymnasium import spaces

__all__ = ["ALGOS", "make_env_worker", "make_learner"]

ALGOS = ("dqn", "dpg")

_DQN_ONLY = ("hiddens", "dueling", "double_q", "frame_stack", "vector_mode")
_DPG_WORKER = ("actor_hiddens", "critic_hiddens", "twin_q", "noise", "ou_theta")


def _check(algo: str) -> None:
    if algo not in ALGOS:
        raise ValueError(f"algo must be one of {ALGOS}, got {algo!r}")


def make_learner(
    observation_space: spaces.Space, action_space: spaces.Space, *, algo: str = "dqn", **kwargs: Any
) -> Any:
    """A :class:`~apex_dask.algo.learner.Learner` (``dqn``) or
    :class:`~apex_dask.algo.dpg_learner.DPGLearner` (``dpg``) with these keyword arguments."""
    _check(algo)
    if algo == "dpg":
        from apex_dask.algo.dpg_learner import DPGLearner

        return DPGLearner(observation_space, action_space, **kwargs)
    from apex_dask.algo.learner import Learner

    return Learner(observation_space, action_space, **kwargs)


def make_env_worker(
    env_factory: Callable[[], Any],
    *,
    algo: str = "dqn",
    epsilon: float,
    dpg: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """An :class:`~apex_dask.algo.env_worker.EnvWorker` (``dqn``) or a
    :class:`~apex_dask.algo.dpg_worker.DPGEnvWorker` (``dpg``: ``epsilon`` is its sigma)."""
    _check(algo)
    if algo == "dpg":
        from apex_dask.algo.dpg_worker import DPGEnvWorker

        for key in _DQN_ONLY:
            kwargs.pop(key, None)
        extra = {k: v for k, v in (dpg or {}).items() if k in _DPG_WORKER}
        return DPGEnvWorker(env_factory, sigma=epsilon, **kwargs, **extra)
    from apex_dask.algo.env_worker import EnvWorker

    return EnvWorker(env_factory, epsilon=epsilon, **kwargs)
