"""Partially observable CartPole: positions only, the velocities hidden.

CartPole-v1's observation is ``(x, x_dot, theta, theta_dot)``; this env shows
``(x, theta)`` only, so one observation does not tell where the pole is going. A
policy must infer the velocities from past observations: a recurrent agent
(``algo: r2d2``) can, a feed-forward DQN on single observations cannot. Everything
else is CartPole-v1's: dynamics, reward 1 per step, termination, the 500-step time
limit, rendering. Use it by the module-qualified id (gymnasium imports this module,
which registers it)::

    cfg = ApexConfig.preset("cartpole_pomdp")      # env.env_id: POMDP_CARTPOLE_ID
    env = gymnasium.make(POMDP_CARTPOLE_ID)
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

__all__ = ["POMDP_CARTPOLE_ID", "PositionsOnly", "make_positions_cartpole"]

POMDP_CARTPOLE_ID = "apex_dask.algo.envs.pomdp:CartPolePositions-v1"

KEEP = (0, 2)
"""The indices of CartPole's observation that stay: cart position, pole angle."""


class PositionsOnly(gym.ObservationWrapper):
    """Keeps the observation entries :data:`KEEP` (float32)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        box = env.observation_space
        idx = list(KEEP)
        self.observation_space = spaces.Box(box.low[idx], box.high[idx], dtype=np.float32)

    def observation(self, observation: Any) -> np.ndarray:
        return np.asarray(observation, np.float32)[list(KEEP)]


def make_positions_cartpole(**kwargs: Any) -> gym.Env:
    """CartPole (``kwargs`` as CartPoleEnv takes them, e.g. ``render_mode``) with the
    velocities hidden."""
    return PositionsOnly(CartPoleEnv(**kwargs))


if "CartPolePositions-v1" not in gym.registry:
    gym.register(
        id="CartPolePositions-v1",
        entry_point=make_positions_cartpole,
        max_episode_steps=500,
        reward_threshold=475.0,
    )
