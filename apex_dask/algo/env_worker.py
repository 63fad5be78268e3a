"""An epsilon-greedy env worker: rollouts with n-step transitions and initial priorities.

Usage loop (a runner or actor drives it)::

    worker = EnvWorker(make_env_factory("CartPole-v1"), epsilon=0.4, seed=1)
    worker.set_weights(*learner.get_weights())
    rollout = worker.sample()         # fragment_length env steps
    shard.add(rollout["batch"], rollout["priorities"])

Acting: with probability ``epsilon`` a uniform random action (drawn from the
worker's own seeded ``numpy.random.Generator``; no forward pass is made),
else ``argmax_a Q(s, a)`` under the last synced weights. Vector observations
use a numpy forward pass (:class:`~apex_dask.algo.networks.NumpyMLPQ`),
images go through torch. The caller should run ``torch.set_num_threads(1)``
in the worker's process: batch-1 forwards are slower with more threads.

Each step goes through an :class:`~apex_dask.algo.nstep.NStepAdder` whose
pending steps carry over between fragments, so a fragment holds the
transitions *completed* during its steps (about ``fragment_length``, not
exactly). Initial priorities are |td| from the worker's own (possibly stale)
weights with the double-DQN target, online = target = the synced weights:
``|R + discount * Q(s', argmax_b Q(s', b)) - Q(s, a)|``.

Frame stacks: with ``frame_stack=k`` (observations ``[k, *frame_shape]``, as
gymnasium's ``FrameStackObservation`` makes them) the rollout's batch is sent
in the compact form of :mod:`apex_dask.algo.frame_codec`: ``frames`` (each
frame of the fragment once) with ``obs_refs`` and ``next_obs_refs`` in place
of ``obs`` and ``next_obs``; a shard built with the same ``frame_stack``
stores it as it is. Priorities are computed on the full stacks first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from apex_dask.algo.frame_codec import encode_batch
from apex_dask.algo.learner import module_weights
from apex_dask.algo.loss import td_errors_numpy
from apex_dask.algo.networks import NumpyMLPQ, build_q_network
from apex_dask.algo.nstep import NStepAdder, stack_transitions

__all__ = ["EnvWorker", "probe_spaces"]


def probe_spaces(env_factory: Callable[[], gym.Env]) -> tuple[spaces.Space, spaces.Space]:
    """``(observation_space, action_space)`` of the env the factory makes (made, then closed)."""
    env = env_factory()
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


class EnvWorker:
    """One env plus an epsilon-greedy policy; see the module docstring.

    Before the first :meth:`set_weights` the worker acts with its own random
    initial weights and ``weights_version == -1``.
    """

    def __init__(
        self,
        env_factory: Callable[[], gym.Env],
        *,
        epsilon: float,
        seed: int,
        n_step: int = 3,
        gamma: float = 0.99,
        fragment_length: int = 50,
        hiddens: Sequence[int] = (256,),
        dueling: bool = True,
        double_q: bool = True,
        frame_stack: int | None = None,
    ) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")
        if fragment_length < 1:
            raise ValueError(f"fragment_length must be >= 1, got {fragment_length}")
        self.env_factory = env_factory
        self.env = env_factory()
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self._net = build_q_network(self.observation_space, self.action_space, hiddens, dueling)
        self._net.eval()
        self._numpy_net: NumpyMLPQ | None = None
        if len(self.observation_space.shape) == 1:
            self._numpy_net = NumpyMLPQ(module_weights(self._net))
        self.epsilon = float(epsilon)
        self.seed = int(seed)
        self.fragment_length = int(fragment_length)
        self.double_q = bool(double_q)
        self.num_actions = int(self.action_space.n)
        self._action_offset = int(self.action_space.start)
        self._obs_shape = tuple(self.observation_space.shape)
        self._obs_dtype = self.observation_space.dtype
        if frame_stack is not None and self._obs_shape[:1] != (frame_stack,):
            raise ValueError(
                f"frame_stack={frame_stack} needs observations [{frame_stack}, ...] "
                f"(first axis the stack), the env gives {list(self._obs_shape)}"
            )
        self.frame_stack = frame_stack
        self.rng = np.random.default_rng(seed)
        self._eval_rng = np.random.default_rng([seed, 1])
        self._eval_env: gym.Env | None = None
        self.adder = NStepAdder(n_step, gamma)
        self.weights_version = -1
        self.steps_sampled = 0
        self.episodes = 0
        self._obs = self._as_obs(self.env.reset(seed=self.seed)[0])
        self._episode_return = 0.0
        self._episode_length = 0

    # -- policy ---------------------------------------------------------
    def _as_obs(self, obs: Any) -> np.ndarray:
        return np.array(obs, dtype=self._obs_dtype)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values (B, A) float32 of a batch of observations under the synced weights."""
        if self._numpy_net is not None:
            return self._numpy_net.q_values(obs)
        with torch.inference_mode():
            return self._net(torch.as_tensor(obs)).numpy()

    def _greedy(self, obs: np.ndarray) -> int:
        return int(np.argmax(self.q_values(obs[None])[0]))

    def _act(self, obs: np.ndarray) -> int:
        if self.epsilon > 0.0 and self.rng.random() < self.epsilon:
            return int(self.rng.integers(self.num_actions))
        return self._greedy(obs)

    def set_weights(self, version: int, weights: Mapping[str, np.ndarray]) -> None:
        """Act with these weights (a learner's ``get_weights()``) from now on."""
        if self._numpy_net is not None:
            self._numpy_net = NumpyMLPQ(weights)
        else:
            self._net.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})
        self.weights_version = int(version)

    # -- rollouts -------------------------------------------------------
    def sample(self) -> dict[str, Any]:
        """Run ``fragment_length`` env steps; return the completed transitions and stats.

        Keys: ``batch`` (``obs, action, reward, next_obs, done, discount`` arrays;
        with ``frame_stack``: ``frames, obs_refs, action, reward, next_obs_refs,
        done, discount``), ``priorities`` (float32 |td|), ``steps``, ``episode_returns``,
        ``episode_lengths``, ``weights_version``, ``epsilon``.
        """
        env, adder = self.env, self.adder
        transitions: list[dict[str, Any]] = []
        returns: list[float] = []
        lengths: list[int] = []
        obs = self._obs
        for _ in range(self.fragment_length):
            action = self._act(obs)
            next_obs, reward, terminated, truncated, _ = env.step(action + self._action_offset)
            next_obs = self._as_obs(next_obs)
            self._episode_return += float(reward)
            self._episode_length += 1
            transitions += adder.add(obs, action, reward, next_obs, terminated, truncated)
            if terminated or truncated:
                returns.append(self._episode_return)
                lengths.append(self._episode_length)
                self._episode_return, self._episode_length = 0.0, 0
                self.episodes += 1
                obs = self._as_obs(env.reset()[0])
            else:
                obs = next_obs
        self._obs = obs
        self.steps_sampled += self.fragment_length
        batch = stack_transitions(transitions, self._obs_shape, self._obs_dtype)
        priorities = self.td_errors(batch)
        if self.frame_stack is not None:
            batch = encode_batch(batch, self.frame_stack)
        return {
            "batch": batch,
            "priorities": priorities,
            "steps": self.fragment_length,
            "episode_returns": returns,
            "episode_lengths": lengths,
            "weights_version": self.weights_version,
            "epsilon": self.epsilon,
        }

    def td_errors(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """float32 |td| of a batch under the synced weights (online = target)."""
        n = len(batch["action"])
        if n == 0:
            return np.zeros(0, np.float32)
        q_all = self.q_values(np.concatenate([batch["obs"], batch["next_obs"]]))
        q, q_next = q_all[:n], q_all[n:]
        return td_errors_numpy(
            q,
            q_next,
            q_next,
            batch["action"],
            batch["reward"],
            batch["discount"],
            double_q=self.double_q,
        )

    # -- evaluation -----------------------------------------------------
    def evaluate(
        self, num_episodes: int, seed: int | None = None, max_steps: int | None = None
    ) -> dict[str, Any]:
        """Greedy (epsilon 0) episodes on a separate env instance.

        Episode i resets with ``seed + i`` when ``seed`` is given, else with a seed
        from the worker's evaluation generator. ``max_steps`` cuts an episode
        (for envs without a time limit). Returns ``return_mean``, ``return_std``
        (NaN for zero episodes), ``returns`` and ``lengths``.
        """
        if self._eval_env is None:
            self._eval_env = self.env_factory()
        env = self._eval_env
        returns: list[float] = []
        lengths: list[int] = []
        for i in range(int(num_episodes)):
            ep_seed = seed + i if seed is not None else int(self._eval_rng.integers(2**31))
            obs = self._as_obs(env.reset(seed=ep_seed)[0])
            total, length, done = 0.0, 0, False
            while not done:
                action = self._greedy(obs)
                obs, reward, terminated, truncated, _ = env.step(action + self._action_offset)
                obs = self._as_obs(obs)
                total += float(reward)
                length += 1
                done = terminated or truncated or (max_steps is not None and length >= max_steps)
            returns.append(total)
            lengths.append(length)
        return {
            "return_mean": float(np.mean(returns)) if returns else math.nan,
            "return_std": float(np.std(returns)) if returns else math.nan,
            "returns": returns,
            "lengths": lengths,
        }

    def close(self) -> None:
        """Close the envs."""
        self.env.close()
        if self._eval_env is not None:
            self._eval_env.close()
