"""A gymnasium env whose construction waits while a flag file exists (test helper).

Put ``tests/`` on ``sys.path`` (Dask worker processes inherit it through
``PYTHONPATH``) and name it ``flagged_envs:WaitOnFlag-v0`` with
``env_kwargs={"flag": path}``: while ``path`` exists, making the env blocks
(an actor being created on a worker then stays "being created" for as long as
the test wants); otherwise it is a 4-float, 2-action env whose episodes are
truncated after ``episode_len`` steps, reward 1 per step.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["WaitOnFlag"]


class WaitOnFlag(gym.Env):
    metadata: dict = {"render_modes": []}

    def __init__(self, flag: str = "", episode_len: int = 50) -> None:
        while flag and os.path.exists(flag):
            time.sleep(0.05)
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.episode_len = int(episode_len)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: int):
        self._t += 1
        obs = np.full(4, 0.01 * (self._t % 5), np.float32)
        return obs, 1.0, False, self._t >= self.episode_len, {}


if "WaitOnFlag-v0" not in gym.registry:
    gym.register(id="WaitOnFlag-v0", entry_point=WaitOnFlag)
