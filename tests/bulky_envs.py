"""A gymnasium env whose observations are large, registered at import (test helper).

Put ``tests/`` on ``PYTHONPATH`` and name it ``bulky_envs:Bulky-v0``
(``--set env.env_id=bulky_envs:Bulky-v0 --set env.env_kwargs.obs_dim=32768``):
each observation is ``obs_dim`` float32 values (128 KiB at 32,768), so a replay
of a few thousand items holds hundreds of MB, more than a checkpoint can write
in a short grace. Two actions, reward 1 per step, episodes truncated after
``episode_len`` steps; stepping costs almost nothing but filling the array.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["Bulky"]


class Bulky(gym.Env):
    metadata: dict = {"render_modes": []}

    def __init__(self, obs_dim: int = 32768, episode_len: int = 50) -> None:
        self.observation_space = spaces.Box(0.0, 1.0, (int(obs_dim),), np.float32)
        self.action_space = spaces.Discrete(2)
        self.episode_len = int(episode_len)
        self._t = 0

    def _obs(self) -> np.ndarray:
        return np.full(self.observation_space.shape, self._t / self.episode_len, np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action: int):
        self._t += 1
        return self._obs(), 1.0, False, self._t >= self.episode_len, {}


if "Bulky-v0" not in gym.registry:
    gym.register(id="Bulky-v0", entry_point=Bulky)
