"""Small gymnasium envs that misbehave as real simulators do, registered at import.

Put ``tests/`` on ``PYTHONPATH`` and name them as ``misbehaving_envs:<Name>-v0``
(``--set env.env_id=misbehaving_envs:RaiseEvery-v0``); Dask worker processes
inherit the path. Every one is a 4-float, 2-action env whose episodes are
truncated after ``episode_len`` steps with reward 1 per step; each counts its
own steps (a new instance starts again from 0).

- ``HangOnMake-v0``: the constructor never returns (a simulator that is not up);
- ``HangOnWorker-v0``: the same, but only in a Dask worker (the CLI's probe passes);
- ``RaiseEvery-v0``: ``step`` raises ``error`` (``RuntimeError``, or
  ``ConnectionResetError``, an ``OSError``) every ``every`` steps (a dropped connection);
  each step first sleeps ``sleep_s`` seconds (0: as fast as CartPole; a heavy simulator);
- ``NonFinite-v0``: from step ``at`` on, NaN observations (``obs=True``) and/or
  NaN rewards (``reward=True``);
- ``HangStep-v0``: step ``at`` sleeps ``hang_s`` seconds (a hung simulator).
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["Base", "HangOnMake", "HangOnWorker", "HangStep", "NonFinite", "RaiseEvery"]


class Base(gym.Env):
    metadata: dict = {"render_modes": []}

    def __init__(self, episode_len: int = 20) -> None:
        self.observation_space = spaces.Box(-10.0, 10.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.episode_len = int(episode_len)
        self.steps = 0  # over the instance's life
        self._t = 0

    def _obs(self) -> np.ndarray:
        return np.full(4, 0.01 * (self._t % 7), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action: int):
        self.steps += 1
        self._t += 1
        return self._obs(), 1.0, False, self._t >= self.episode_len, {}


class HangOnMake(Base):
    def __init__(self, **kwargs) -> None:
        while True:
            time.sleep(3600)


class HangOnWorker(Base):
    """Made at once in the process that runs the CLI, never in a Dask worker's."""

    def __init__(self, **kwargs) -> None:
        import multiprocessing

        while multiprocessing.current_process().name != "MainProcess":
            time.sleep(3600)
        super().__init__(**kwargs)


class RaiseEvery(Base):
    def __init__(
        self, every: int = 5000, error: str = "RuntimeError", sleep_s: float = 0.0, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.every, self.sleep_s = int(every), float(sleep_s)
        self.error = {"RuntimeError": RuntimeError, "ConnectionResetError": ConnectionResetError}[
            error
        ]

    def step(self, action: int):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        out = super().step(action)
        if self.steps % self.every == 0:
            raise self.error(f"simulator connection dropped after {self.steps} steps")
        return out


class NonFinite(Base):
    def __init__(self, at: int = 13, obs: bool = True, reward: bool = True, **kwargs) -> None:
        super().__init__(**kwargs)
        self.at, self.nan_obs, self.nan_reward = int(at), bool(obs), bool(reward)

    def step(self, action: int):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.steps >= self.at:
            if self.nan_obs:
                obs = np.full(4, np.nan, np.float32)
            if self.nan_reward:
                reward = float("nan")
        return obs, reward, terminated, truncated, info


class HangStep(Base):
    def __init__(self, at: int = 100, hang_s: float = 3600.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.at, self.hang_s = int(at), float(hang_s)

    def step(self, action: int):
        if self.steps + 1 == self.at:
            time.sleep(self.hang_s)
        return super().step(action)


for _name in ("HangOnMake", "HangOnWorker", "RaiseEvery", "NonFinite", "HangStep"):
    if f"{_name}-v0" not in gym.registry:
        gym.register(f"{_name}-v0", entry_point=f"{__name__}:{_name}")
