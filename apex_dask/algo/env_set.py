"""An env worker's envs, stepped together: one call steps every env.

:class:`GuardedEnvs` holds ``num_envs`` gymnasium envs made by a factory
and steps them one after the other through an
:class:`~apex_dask.algo.env_guard.EnvGuard` (bounded calls, non-finite
checks, envs made again after an error). :mod:`apex_dask.algo.native_envs`
gives the same interface over a native vector env. Both return one
:class:`VectorStep` per step, arrays over the env axis::

    envs = GuardedEnvs(factory, num_envs=8, seed=0, guard=guard, policy=policy)
    obs = envs.reset()                      # (N, *obs_shape)
    step = envs.step(actions)               # actions: int64 (N,), index into Discrete
    step.next_obs[j]                        # s_{t+1}: the final observation at an episode end
    step.obs[j]                             # what env j acts on next (the reset one after an end)

An env that ended (``terminated or truncated``) is reset inside ``step``.
An env error makes ``active[j]`` False: that step of env j is left out (its
pending n-step steps must be dropped by the caller), env j was made again
and ``obs[j]`` is its first observation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from apex_dask.algo.env_guard import EnvErrorPolicy, EnvFailed, EnvFault, EnvGuard, check_finite

__all__ = ["REMAKE_TRIES", "GuardedEnvs", "VectorStep"]

REMAKE_TRIES = 3
"""Attempts to make (and reset) a failed env again before the run ends (EnvFailed)."""


@dataclass
class VectorStep:
    """One step of every env; arrays over the env axis."""

    obs: np.ndarray
    """What each env acts on next (after an episode end: its reset observation)."""
    next_obs: np.ndarray
    """s_{t+1} of each env's transition (after an episode end: the final observation)."""
    reward: np.ndarray
    """The env's own (raw) reward, float64: episode returns count it."""
    train_reward: np.ndarray
    """What the learner trains on (``info["train_reward"]`` if given, else ``reward``)."""
    terminated: np.ndarray
    truncated: np.ndarray
    train_terminated: np.ndarray
    """``info["train_terminated"]`` if given (a lost life), else ``terminated``."""
    active: np.ndarray
    """False where the step failed (an env error): it is left out."""


class GuardedEnvs:
    """``num_envs`` gymnasium envs stepped in turn through a guard; see the module docstring.

    Only the first env is made at construction (an evaluator needs no more);
    :meth:`reset` makes the others. Env j resets first with ``seed + j``.
    """

    def __init__(
        self,
        factory: Callable[[], gym.Env],
        *,
        num_envs: int,
        seed: int,
        guard: EnvGuard,
        policy: EnvErrorPolicy,
        rng: np.random.Generator,
        where: str = "",
    ) -> None:
        self.factory, self.num_envs, self.seed = factory, int(num_envs), int(seed)
        self.guard, self.policy, self.rng, self.where = guard, policy, rng, where
        self.env_id = guard.env_id
        self._steps = [0] * self.num_envs
        self.envs = [self._first_env()]
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        self._offset = int(self.action_space.start)
        self._dtype = self.observation_space.dtype
        self._obs: list[np.ndarray] = [self._first_reset(0, self.envs[0], self.seed)]

    def _at(self) -> str:
        return f" ({self.where})" if self.where else ""

    def _first_env(self) -> gym.Env:
        try:
            return self.guard.make(self.factory)
        except EnvFault as fault:
            raise EnvFailed(f"{fault}{self._at()}") from None

    def _first_reset(self, j: int, env: gym.Env, seed: int) -> np.ndarray:
        try:
            return self._reset(j, env, seed)
        except EnvFault as fault:
            raise EnvFailed(f"{fault}{self._at()}") from None

    def _as_obs(self, obs: Any) -> np.ndarray:
        return np.array(obs, dtype=self._dtype)

    def _reset(self, j: int, env: gym.Env, seed: int | None) -> np.ndarray:
        t = self._steps[j]
        obs = self._as_obs(self.guard.call("reset", lambda: env.reset(seed=seed), t)[0])
        check_finite(obs, 0.0, self.env_id, t, what="reset")
        return obs

    def reset(self) -> np.ndarray:
        """Make the envs not made yet; the observations every env acts on next (N, ...)."""
        for j in range(len(self.envs), self.num_envs):
            env = self._first_env()
            self.envs.append(env)
            self._obs.append(self._first_reset(j, env, self.seed + j))
        return np.stack(self._obs)

    def _step_one(self, j: int, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        env = self.envs[j]
        self._steps[j] += 1
        t = self._steps[j]
        next_obs, reward, terminated, truncated, info = self.guard.call(
            "step", lambda: env.step(action + self._offset), t
        )
        next_obs = self._as_obs(next_obs)
        check_finite(next_obs, reward, self.env_id, t)
        if "train_reward" in info:
            check_finite(next_obs, info["train_reward"], self.env_id, t)
        return next_obs, float(reward), bool(terminated), bool(truncated), info

    def step(self, actions: np.ndarray) -> VectorStep:
        """Step every env once (see the module docstring)."""
        n = self.num_envs
        nxt: list[np.ndarray] = list(self._obs)
        reward, train_reward = np.zeros(n), np.zeros(n)
        term, trunc, train_term = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
        active = np.ones(n, bool)
        for j in range(n):
            try:
                o, r, te, tr, info = self._step_one(j, int(actions[j]))
                nxt[j], reward[j], term[j], trunc[j] = o, r, te, tr
                train_reward[j] = info.get("train_reward", r)
                train_term[j] = bool(info.get("train_terminated", te))
                if te or tr:  # an error here: the episode counts, the env is made again
                    self._obs[j] = self._reset(j, self.envs[j], None)
                else:
                    self._obs[j] = o
            except EnvFault as fault:
                # a reset after an episode end that fails leaves the step itself counted
                active[j] = bool(term[j] or trunc[j])
                self.replace(j, fault)
        next_obs = np.stack(nxt)
        ended = term | trunc
        obs = np.stack(self._obs) if ended.any() or not active.all() else next_obs
        return VectorStep(obs, next_obs, reward, train_reward, term, trunc, train_term, active)

    def replace(self, j: int, fault: EnvFault) -> None:
        """Count ``fault`` (EnvFailed if the run must end); env ``j`` made again and reset."""
        self.policy.record(fault, self.where)
        self.guard.discard(self.envs[j])
        for attempt in range(1, REMAKE_TRIES + 1):
            env = None
            try:
                env = self.guard.make(self.factory)
                self._obs[j] = self._reset(j, env, int(self.rng.integers(2**31)))
                break
            except EnvFault as again:
                if env is not None:
                    self.guard.discard(env)
                if attempt == REMAKE_TRIES:  # a simulator that is gone, however slow
                    raise EnvFailed(
                        f"{again}{self._at()}; it failed to be made again {attempt} times "
                        "in a row after an env error"
                    ) from None
                self.policy.record(again, self.where)
        self.envs[j] = env

    def close(self) -> None:
        """Close every env (a hung one once its call returns)."""
        for env in self.envs:
            self.guard.discard(env)
