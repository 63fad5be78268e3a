"""An epsilon-greedy env worker: rollouts with n-step transitions and initial priorities.

Usage loop (a runner or actor drives it)::

    worker = EnvWorker(make_env_factory("CartPole-v1"), epsilon=0.4, seed=1)
    worker.set_weights(*learner.get_weights())
    rollout = worker.sample()         # fragment_length env steps
    shard.add(rollout["batch"], rollout["priorities"])

Batched acting: a worker steps ``num_envs`` envs of its own in a plain loop
(``workers.envs_per_worker``; RLlib's tuned Atari Ape-X ran 8) and picks
their actions with one forward pass per step for all of them. Every env
keeps its own n-step adder and episode stats; all use the worker's epsilon.
For each env, with probability ``epsilon`` a uniform random action (drawn from the
worker's own seeded ``numpy.random.Generator``; no forward pass is made),
else ``argmax_a Q(s, a)`` under the last synced weights. Vector observations
use a numpy forward pass (:class:`~apex_dask.algo.networks.NumpyMLPQ`),
images go through torch. The caller should run ``torch.set_num_threads(1)``
in the worker's process: small-batch forwards are slower with more threads.

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
import time
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
        num_envs: int = 1,
    ) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")
        if fragment_length < 1:
            raise ValueError(f"fragment_length must be >= 1, got {fragment_length}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = int(num_envs)
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
        self.envs = [self.env]  # the others are made by the first sample() (not for evaluators)
        self.adders = [NStepAdder(n_step, gamma) for _ in range(self.num_envs)]
        self.adder = self.adders[0]
        self.weights_version = -1
        self.steps_sampled = 0
        self.episodes = 0
        # env j resets first with seed + j, then continues its own generator
        self._obs = [self._as_obs(self.env.reset(seed=self.seed)[0])]
        self._episode_return = [0.0] * self.num_envs
        self._episode_length = [0] * self.num_envs

    def _make_envs(self) -> None:
        for j in range(len(self.envs), self.num_envs):
            env = self.env_factory()
            self.envs.append(env)
            self._obs.append(self._as_obs(env.reset(seed=self.seed + j)[0]))

    @property
    def num_pending(self) -> int:
        """Steps of all envs whose transition is not emitted yet."""
        return sum(a.num_pending for a in self.adders)

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

    def _act(self, obs: Sequence[np.ndarray]) -> np.ndarray:
        """One action per env: epsilon-greedy, one forward for all greedy ones."""
        n = len(obs)
        actions = np.zeros(n, np.int64)
        explore = np.zeros(n, bool)
        if self.epsilon > 0.0:
            for j in range(n):  # the same draws as one env at a time
                if self.rng.random() < self.epsilon:
                    explore[j] = True
                    actions[j] = self.rng.integers(self.num_actions)
        greedy = np.flatnonzero(~explore)
        if len(greedy):
            q = self.q_values(np.stack([obs[j] for j in greedy]))
            actions[greedy] = np.argmax(q, axis=1)
        return actions

    def set_weights(self, version: int, weights: Mapping[str, np.ndarray]) -> None:
        """Act with these weights (a learner's ``get_weights()``) from now on."""
        if self._numpy_net is not None:
            self._numpy_net = NumpyMLPQ(weights)
        else:
            self._net.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})
        self.weights_version = int(version)

    # -- rollouts -------------------------------------------------------
    def sample(self) -> dict[str, Any]:
        """Run ``fragment_length`` steps of every env; return the completed transitions and stats.

        Keys: ``batch`` (``obs, action, reward, next_obs, done, discount`` arrays;
        with ``frame_stack``: ``frames, obs_refs, action, reward, next_obs_refs,
        done, discount``), ``priorities`` (float32 |td|), ``steps``
        (``fragment_length * num_envs``), ``episode_returns``,
        ``episode_lengths``, ``weights_version``, ``epsilon``.

        Each env has its own n-step adder; the batch holds env 0's transitions,
        then env 1's, and so on. The adder gets ``info["train_reward"]`` and
        ``info["train_terminated"]`` when the env gives them (clipped rewards,
        a life loss: :mod:`apex_dask.algo.atari`); episode returns and lengths
        count raw rewards over whole episodes (``terminated or truncated``).
        """
        self._make_envs()
        per_env: list[list[dict[str, Any]]] = [[] for _ in self.envs]
        returns: list[float] = []
        lengths: list[int] = []
        obs = self._obs
        for _ in range(self.fragment_length):
            actions = self._act(obs)
            for j, env in enumerate(self.envs):
                action = int(actions[j])
                next_obs, reward, terminated, truncated, info = env.step(
                    action + self._action_offset
                )
                next_obs = self._as_obs(next_obs)
                self._episode_return[j] += float(reward)
                self._episode_length[j] += 1
                per_env[j] += self.adders[j].add(
                    obs[j],
                    action,
                    info.get("train_reward", reward),
                    next_obs,
                    bool(info.get("train_terminated", terminated)),
                    truncated,
                )
                if terminated or truncated:
                    returns.append(self._episode_return[j])
                    lengths.append(self._episode_length[j])
                    self._episode_return[j], self._episode_length[j] = 0.0, 0
                    self.episodes += 1
                    obs[j] = self._as_obs(env.reset()[0])
                else:
                    obs[j] = next_obs
        steps = self.fragment_length * self.num_envs
        self.steps_sampled += steps
        transitions = [t for env_transitions in per_env for t in env_transitions]
        batch = stack_transitions(transitions, self._obs_shape, self._obs_dtype)
        priorities = self.td_errors(batch)
        if self.frame_stack is not None:
            batch = encode_batch(batch, self.frame_stack)
        return {
            "batch": batch,
            "priorities": priorities,
            "steps": steps,
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
        self,
        num_episodes: int,
        seed: int | None = None,
        max_steps: int | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Greedy (epsilon 0) episodes on a separate env instance, bounded in steps and time.

        Episode i resets with ``seed + i`` when ``seed`` is given, else with a seed
        from the worker's evaluation generator. ``max_steps`` cuts an episode
        (it then counts as a finished episode, as a time limit would).
        ``timeout_s`` bounds the whole evaluation: once that much wall time has
        passed, the episode in progress is dropped and no further one starts.
        Returns ``return_mean``, ``return_std`` (over the finished episodes;
        NaN for none), ``returns``, ``lengths`` and ``timed_out`` (bool).
        Returns and ``terminated`` are the env's own (raw scores, whole games).
        """
        if self._eval_env is None:
            self._eval_env = self.env_factory()
        env = self._eval_env
        deadline = math.inf if timeout_s is None else time.monotonic() + float(timeout_s)
        returns: list[float] = []
        lengths: list[int] = []
        timed_out = False
        for i in range(int(num_episodes)):
            if time.monotonic() >= deadline:
                timed_out = True
                break
            ep_seed = seed + i if seed is not None else int(self._eval_rng.integers(2**31))
            obs = self._as_obs(env.reset(seed=ep_seed)[0])
            total, length, done = 0.0, 0, False
            while not done:
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
                action = self._greedy(obs)
                obs, reward, terminated, truncated, _ = env.step(action + self._action_offset)
                obs = self._as_obs(obs)
                total += float(reward)
                length += 1
                done = terminated or truncated or (max_steps is not None and length >= max_steps)
            if timed_out:
                break
            returns.append(total)
            lengths.append(length)
        return {
            "return_mean": float(np.mean(returns)) if returns else math.nan,
            "return_std": float(np.std(returns)) if returns else math.nan,
            "returns": returns,
            "lengths": lengths,
            "timed_out": timed_out,
        }

    def close(self) -> None:
        """Close the envs."""
        for env in self.envs:
            env.close()
        if self._eval_env is not None:
            self._eval_env.close()
