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

Envs that misbehave (:mod:`apex_dask.algo.env_guard`): making an env is
bounded by ``make_timeout_s``, a ``step``/``reset`` by ``step_timeout_s``;
an exception, a late call or a non-finite reward or float observation is an
env error. With ``restart_failed_envs`` it is counted (``env_errors``), the
env is closed (a hung one is abandoned with its thread) and made again, its
partial episode is dropped from the episode stats and its pending n-step
steps are dropped; transitions already complete are kept. More than
``max_env_errors_per_min`` errors within 60 s, or any error with restarts
off, raise :class:`~apex_dask.algo.env_guard.EnvFailed` (one line naming the
env, the error and the step); so does an env that fails to be made again
:data:`REMAKE_TRIES` times in a row. Errors making or resetting the first
envs always raise it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from apex_dask.algo.env_guard import (
    EnvErrorPolicy,
    EnvFailed,
    EnvFault,
    EnvGuard,
    check_finite,
    env_name,
)
from apex_dask.algo.frame_codec import encode_batch
from apex_dask.algo.learner import module_weights
from apex_dask.algo.loss import td_errors_numpy
from apex_dask.algo.networks import NumpyMLPQ, build_q_network
from apex_dask.algo.nstep import NStepAdder, stack_transitions

__all__ = ["REMAKE_TRIES", "EnvWorker", "probe_spaces"]

REMAKE_TRIES = 3
"""Attempts to make (and reset) a failed env again before the run ends (EnvFailed)."""


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
        make_timeout_s: float = 60.0,
        step_timeout_s: float | None = None,
        restart_failed_envs: bool = True,
        max_env_errors_per_min: int = 10,
        where: str = "",
    ) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")
        if fragment_length < 1:
            raise ValueError(f"fragment_length must be >= 1, got {fragment_length}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = int(num_envs)
        self.env_factory = env_factory
        self.env_id = env_name(env_factory)
        self.where = where
        self._guard = EnvGuard(
            self.env_id, make_timeout_s=make_timeout_s, step_timeout_s=step_timeout_s
        )
        self.policy = EnvErrorPolicy(
            self.env_id, restart=restart_failed_envs, max_per_min=max_env_errors_per_min
        )
        self._env_steps = [0] * self.num_envs
        self.env = self._first_env()
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
        self._eval_steps = 0
        self.envs = [self.env]  # the others are made by the first sample() (not for evaluators)
        self.adders = [NStepAdder(n_step, gamma) for _ in range(self.num_envs)]
        self.adder = self.adders[0]
        self.weights_version = -1
        self.steps_sampled = 0
        self.episodes = 0
        # env j resets first with seed + j, then continues its own generator
        self._obs = [self._first_reset(0, self.env, self.seed)]
        self._episode_return = [0.0] * self.num_envs
        self._episode_length = [0] * self.num_envs

    def _first_env(self) -> gym.Env:
        try:
            return self._guard.make(self.env_factory)
        except EnvFault as fault:
            raise EnvFailed(f"{fault}{self._at()}") from None

    def _first_reset(self, j: int, env: gym.Env, seed: int) -> np.ndarray:
        try:
            return self._reset(j, env, seed)
        except EnvFault as fault:
            raise EnvFailed(f"{fault}{self._at()}") from None

    def _at(self) -> str:
        return f" ({self.where})" if self.where else ""

    def _make_envs(self) -> None:
        for j in range(len(self.envs), self.num_envs):
            env = self._first_env()
            self.envs.append(env)
            self._obs.append(self._first_reset(j, env, self.seed + j))

    @property
    def env_errors(self) -> int:
        """Env errors survived or not (raised, hung, non-finite), all envs of this worker."""
        return self.policy.count

    # -- guarded env calls --------------------------------------------------
    def _reset(self, j: int, env: gym.Env, seed: int | None) -> np.ndarray:
        t = self._env_steps[j]
        obs = self._as_obs(self._guard.call("reset", lambda: env.reset(seed=seed), t)[0])
        check_finite(obs, 0.0, self.env_id, t, what="reset")
        return obs

    def _step(self, j: int, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        env = self.envs[j]
        self._env_steps[j] += 1
        t = self._env_steps[j]
        next_obs, reward, terminated, truncated, info = self._guard.call(
            "step", lambda: env.step(action + self._action_offset), t
        )
        next_obs = self._as_obs(next_obs)
        check_finite(next_obs, reward, self.env_id, t)
        if "train_reward" in info:
            check_finite(next_obs, info["train_reward"], self.env_id, t)
        return next_obs, float(reward), bool(terminated), bool(truncated), info

    def _advance(
        self, j: int, action: int, out: list, returns: list[float], lengths: list[int]
    ) -> int:
        """One step of env ``j``: its completed transitions into ``out``, a finished
        episode's return and length into ``returns``/``lengths``; 1 (a step made)."""
        obs = self._obs
        next_obs, reward, terminated, truncated, info = self._step(j, action)
        self._episode_return[j] += reward
        self._episode_length[j] += 1
        out += self.adders[j].add(
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
            obs[j] = self._reset(j, self.envs[j], None)  # an error here: the episode counts
        else:
            obs[j] = next_obs
        return 1

    def _replace_env(self, j: int, fault: EnvFault) -> None:
        """Count ``fault`` (EnvFailed if the run must end); env ``j`` made again, its
        partial episode and pending n-step steps dropped."""
        self.policy.record(fault, self.where)
        self._episode_return[j], self._episode_length[j] = 0.0, 0
        self.adders[j].reset()
        self._guard.discard(self.envs[j])
        for attempt in range(1, REMAKE_TRIES + 1):
            env = None
            try:
                env = self._guard.make(self.env_factory)
                self._obs[j] = self._reset(j, env, int(self.rng.integers(2**31)))
                break
            except EnvFault as again:
                if env is not None:
                    self._guard.discard(env)
                if attempt == REMAKE_TRIES:  # a simulator that is gone, however slow
                    raise EnvFailed(
                        f"{again}{self._at()}; it failed to be made again {attempt} times "
                        "in a row after an env error"
                    ) from None
                self.policy.record(again, self.where)
        self.envs[j] = env
        if j == 0:
            self.env = env

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
        done, discount``), ``priorities`` (float32 |td|), ``steps`` (env steps made:
        ``fragment_length * num_envs`` less those env errors cut), ``episode_returns``,
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
        steps = 0
        for _ in range(self.fragment_length):
            actions = self._act(obs)
            for j in range(len(self.envs)):
                try:
                    steps += self._advance(j, int(actions[j]), per_env[j], returns, lengths)
                except EnvFault as fault:
                    self._replace_env(j, fault)
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
        frames: Any = None,
    ) -> dict[str, Any]:
        """Greedy episodes on a separate env (:func:`.env_eval.greedy_episodes` documents it)."""
        from apex_dask.algo.env_eval import greedy_episodes

        return greedy_episodes(self, int(num_episodes), seed, max_steps, timeout_s, frames)

    def close(self) -> None:
        """Close the envs (a hung one once its call returns) and end their threads."""
        for env in self.envs:
            self._guard.discard(env)
        if self._eval_env is not None:
            self._guard.discard(self._eval_env)
        self._guard.close()
