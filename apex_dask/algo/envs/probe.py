"""The spaces of the env a factory makes, found by making it once (bounded in time)."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
from gymnasium import spaces

from apex_dask.algo.envs.guard import EnvGuard, env_name

__all__ = ["probe_spaces"]


def probe_spaces(
    env_factory: Callable[[], gym.Env], make_timeout_s: float = 60.0
) -> tuple[spaces.Space, spaces.Space]:
    """``(observation_space, action_space)`` of the env the factory makes (made, then
    closed); :class:`EnvFault` if making it raises or takes over ``make_timeout_s``."""
    guard = EnvGuard(env_name(env_factory), make_timeout_s=make_timeout_s)
    env = guard.make(env_factory)
    try:
        return env.observation_space, env.action_space
    finally:
        guard.discard(env)
        guard.close()
