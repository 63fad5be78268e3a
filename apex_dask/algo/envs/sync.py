"""An env worker's envs, stepped together: one call steps every env.

:class:`GuardedEnvs` holds ``num_envs`` gymnasium envs made by a factory
and steps them one after the other through an
:class:`~apex_dask.algo.envs.guard.EnvGuard` (bounded calls, non-finite
checks, envs made again after an error). :mod:`apex_dask.algo.envs.native`
gives the same interface over a native vector env. Both return one
:class:`VectorStep` per step, arrays over the env axis::

    envs = GuardedEnvs(factory, num_envs=8, seed=0, guard=guard, policy=policy)
    obs = envs.reset()                      # (N, *obs_shape)
    step = envs.step(actions)               # int64 (N,) into Discrete, or (N, d) in a Box
    step.next_obs[j]                        # s_{t+1}: the final observation at an episode end
    step.obs[j]                             # what env j acts on next (the reset one after an end)

An env that ended (``terminated or truncated``) is reset inside ``step``.
An env error makes ``active[j]`` False: that step of env j is left out (its
pending n-step steps must be dropped by the caller), env j was made again
and ``obs[j]`` is its first observation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np

from apex_dask.algo.envs.guard import EnvErrorPolicy, EnvFailed, EnvFault, EnvGuard, check_finite

__all__ = ["REMAKE_TRIES", "GuardedEnvs", "VectorStep"]

REMAKE_TRIES = 3
"""Attempts to make (and reset) a failed env again before the run ends (EnvFailed)."""


def _finite(rewards: Any, train_rewards: Any) -> bool:
    """Whether every reward is a finite number (False also for a non-number)."""
    try:  # a sum is not finite if a term is not (inf - inf is nan)
        return math.isfinite(sum(rewards) + sum(train_rewards))
    except (TypeError, ValueError, OverflowError):
        return False


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
    any_end: bool = True
    """Whether any env's episode ended (``terminated | truncated``); True if unknown."""
    all_active: bool = False
    """Whether no step failed; False if unknown."""


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
        self._offset = int(getattr(self.action_space, "start", 0))  # Box: actions as they are
        self._discrete = isinstance(self.action_space, gym.spaces.Discrete)
        self._dtype = self.observation_space.dtype
        self._float = self._dtype.kind == "f"
        self._on = np.ones(self.num_envs, bool)  # every step made (read-only)
        self._on.flags.writeable = False
        self._off = np.zeros(self.num_envs, bool)  # no env's episode ended (read-only)
        self._off.flags.writeable = False
        # what each env acts on next: a list until every env is made, then (N, ...)
        self._obs: Any = [self._first_reset(0, self.envs[0], self.seed)]

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
        if isinstance(self._obs, list):
            self._obs = np.stack(self._obs)
        return self._obs

    def step(self, actions: np.ndarray) -> VectorStep:
        """Step every env once (see the module docstring)."""
        n, envs, off, call = self.num_envs, self.envs, self._offset, self.guard.call
        steps, out, faults = self._steps, [], {}
        for j, action in enumerate(actions.tolist() if self._discrete else actions):
            steps[j] += 1
            try:
                out.append(call("step", partial(envs[j].step, action + off), steps[j]))
            except EnvFault as fault:
                faults[j] = fault
                out.append((self._obs[j], 0.0, False, False, {}))
        obs_list, rewards, terms, truncs, infos = zip(*out, strict=True)
        next_obs = np.array(obs_list, self._dtype)
        reward = np.array(rewards, np.float64)
        train_reward, train_terms, checked = reward, terms, ()
        if any(infos) and any("train_reward" in i or "train_terminated" in i for i in infos):
            checked = [i.get("train_reward", r) for i, r in zip(infos, rewards, strict=True)]
            train_reward = np.array(checked, np.float64)
            train_terms = [i.get("train_terminated", t) for i, t in zip(infos, terms, strict=True)]
        if not _finite(rewards, checked) or (
            self._float and not np.isfinite(next_obs).all()
        ):  # which env: the slow path, rarely taken
            for j in range(n):
                try:
                    check_finite(next_obs[j], reward[j], self.env_id, steps[j])
                    check_finite(next_obs[j], train_reward[j], self.env_id, steps[j])
                except EnvFault as fault:
                    faults.setdefault(j, fault)
        if not faults and not (any(terms) or any(truncs) or any(train_terms)):  # most steps
            policy = self.policy  # policy.completed(n), inlined: the hot path
            policy.steps += n
            if policy.streaks:
                policy.streaks.clear()
            self._obs, on, no = next_obs, self._on, self._off
            return VectorStep(next_obs, next_obs, reward, train_reward, no, no, no, on, False, True)
        term, trunc = np.array(terms, bool), np.array(truncs, bool)
        train_term = np.array(train_terms, bool)
        return self._edges(next_obs, reward, train_reward, term, trunc, train_term, faults)

    def _edges(
        self,
        next_obs: np.ndarray,
        reward: np.ndarray,
        train_reward: np.ndarray,
        term: np.ndarray,
        trunc: np.ndarray,
        train_term: np.ndarray,
        faults: dict[int, EnvFault],
    ) -> VectorStep:
        """A step with episode ends or env errors: resets, envs made again."""
        active = np.ones(self.num_envs, bool)
        for j in faults:  # the step is left out
            active[j] = False
            term[j] = trunc[j] = train_term[j] = False
            reward[j] = train_reward[j] = 0.0
        for j in np.flatnonzero(active):  # their errors in a row end
            self.policy.completed(1, int(j))
        ended = term | trunc
        self._obs = next_obs.copy()  # the reset or new envs' first observations below
        for j in range(self.num_envs):
            if j in faults:
                self.replace(j, faults[j])
                next_obs[j] = self._obs[j]
            elif ended[j]:
                try:  # an error here: the episode counts, the env is made again
                    self._obs[j] = self._reset(j, self.envs[j], None)
                except EnvFault as fault:
                    self.replace(j, fault)
        return VectorStep(
            self._obs,
            next_obs,
            reward,
            train_reward,
            term,
            trunc,
            train_term,
            active,
            any_end=bool(ended.any()),
            all_active=not faults,
        )

    def replace(self, j: int, fault: EnvFault) -> None:
        """Count ``fault`` (EnvFailed if the run must end); env ``j`` made again and reset."""
        self.policy.record(fault, self.where, j)
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
                self.policy.record(again, self.where, j)
        self.envs[j] = env

    def close(self) -> None:
        """Close every env (a hung one once its call returns)."""
        for env in self.envs:
            self.guard.discard(env)
