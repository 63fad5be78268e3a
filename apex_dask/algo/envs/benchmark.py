"""Environments for measuring the runtime itself (not for learning).

``ApexSleepy-v0`` stands in for a heavy simulator: every ``step`` sleeps a
fixed ``step_s`` (default 2 ms) and does almost no computation, so the env
steps/s of N env workers is bounded by overlap, not by CPU cores. Use it by
the module-qualified id (gymnasium imports this module, which registers it)::

    cfg = ApexConfig.preset("cartpole").override(
        {"env.env_id": SLEEPY_ID, "env.env_kwargs": {"step_s": 0.002}})

Observations are 4 floats drawn from the env's seeded generator, 2 actions,
reward 1 per step, episodes truncated after ``max_steps`` steps.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["SLEEPY_ID", "SleepyEnv"]

SLEEPY_ID = "apex_dask.algo.envs.benchmark:ApexSleepy-v0"


class SleepyEnv(gym.Env):
    """Each step sleeps ``step_s`` seconds; see the module docstring."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, step_s: float = 0.002, max_steps: int = 200) -> None:
        self.step_s = float(step_s)
        self.max_steps = int(max_steps)
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action: int):
        time.sleep(self.step_s)
        self._t += 1
        return self._obs(), 1.0, False, self._t >= self.max_steps, {}

    def _obs(self) -> np.ndarray:
        return self.np_random.uniform(-1.0, 1.0, size=4).astype(np.float32)


if "ApexSleepy-v0" not in gym.registry:
    gym.register(id="ApexSleepy-v0", entry_point=SleepyEnv)
