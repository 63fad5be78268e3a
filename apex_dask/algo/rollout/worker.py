"""What every env worker shares, whatever chooses its actions: envs, the rollout loop, stats.

:class:`ActingWorker` owns a worker's envs (``num_envs`` of them, made and
stepped through one :class:`~apex_dask.algo.envs.guard.EnvGuard`), its seeded
generator, its episode statistics and greedy evaluation. Its :meth:`sample`
runs the fragment loop; an agent's worker supplies the policy through four
hooks and a :class:`~apex_dask.algo.rollout.vector_nstep.VectorNStepAdder` as
``self.adder``:

- ``_begin_fragment()``: per-fragment draws (epsilon-greedy's explore masks);
- ``_actions(t)``: the actions of step ``t`` for every env (it gives the adder
  the step's values for the initial priorities);
- ``_episodes_ended(mask)``: envs whose episode ended or failed (noise resets);
- ``_end_fragment()``: the values of the states the envs act on next;
- ``_begin_eval_episode()``: a greedy evaluation episode begins (a recurrent
  policy's state goes back to zero);
- ``_greedy(obs)``: the greedy action of one observation, for evaluation (the env's
  action is that plus ``_action_offset``: a Discrete space's ``start``).

Each agent's worker (in its folder under ``agents/``) is one: DQN's
epsilon-greedy over Q-values, DPG's deterministic policy plus noise, R2D2's
epsilon-greedy over a recurrent Q-network (its adder makes sequence items).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from apex_dask.algo.envs.guard import EnvErrorPolicy, EnvGuard, env_name
from apex_dask.algo.envs.native import NativeAtariEnvs, native_game
from apex_dask.algo.envs.sync import GuardedEnvs, VectorStep
from apex_dask.algo.replay.codec import encode_batch
from apex_dask.algo.rollout.nstep import TRANSITION_KEYS
from apex_dask.algo.rollout.spec import VECTOR_MODES, Rollout, RolloutSpec

__all__ = ["ActingWorker"]


class ActingWorker:
    """Envs, the rollout loop and episode stats of one env worker; see the module docstring."""

    adder: Any
    frame_stack: int | None = None
    exploration: float = 0.0
    _action_offset: int = 0
    """The worker's exploration parameter (its agent's: an epsilon, DPG's noise scale)."""

    def __init__(
        self, env_factory: Callable[[], gym.Env], rollout: RolloutSpec, *, seed: int, where: str
    ) -> None:
        r = rollout
        if r.fragment_length < 1:
            raise ValueError(f"fragment_length must be >= 1, got {r.fragment_length}")
        if r.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {r.num_envs}")
        if r.vector_mode not in VECTOR_MODES:
            raise ValueError(f"vector_mode must be one of {VECTOR_MODES}, got {r.vector_mode!r}")
        self.rollout = r
        self.num_envs = int(r.num_envs)
        self.fragment_length = int(r.fragment_length)
        self.env_factory = env_factory
        self.env_id = env_name(env_factory)
        self.where = where
        self._guard = EnvGuard(
            self.env_id, make_timeout_s=r.make_timeout_s, step_timeout_s=r.step_timeout_s
        )
        self.policy = EnvErrorPolicy(
            self.env_id,
            restart=r.restart_failed_envs,
            max_per_1k_steps=r.max_env_errors_per_1k_steps,
            max_consecutive=r.max_consecutive_env_errors,
        )
        self.seed = int(seed)
        self.rng = np.random.default_rng(seed)
        native = r.vector_mode == "native" and native_game(env_factory) is not None
        self.vector_mode = "native" if native else "sync"
        # env j resets first with seed + j, then continues its own generator
        self._envs = (NativeAtariEnvs if native else GuardedEnvs)(
            env_factory,
            num_envs=self.num_envs,
            seed=self.seed,
            guard=self._guard,
            policy=self.policy,
            rng=self.rng,
            where=where,
        )
        self.observation_space = self._envs.observation_space
        self.action_space = self._envs.action_space
        self._obs_shape = tuple(self.observation_space.shape)
        self._obs_dtype = self.observation_space.dtype
        self._eval_rng = np.random.default_rng([seed, 1])
        self._eval_env: gym.Env | None = None
        self._eval_steps = 0
        self.weights_version = -1
        self.steps_sampled = 0
        self.episodes = 0
        self._obs: np.ndarray | None = None  # (N, ...) once every env is made
        self._episode_return = np.zeros(self.num_envs)
        self._episode_start = np.zeros(self.num_envs, np.int64)  # the clock when it began
        self._clock = 0

    @property
    def envs(self) -> list[gym.Env]:
        """The worker's envs (only the first before the first :meth:`sample`)."""
        return self._envs.envs

    @property
    def env(self) -> gym.Env:
        """The first of this worker's envs."""
        return self._envs.envs[0]

    @property
    def env_errors(self) -> int:
        """Env errors survived or not (raised, hung, non-finite), all envs of this worker."""
        return self.policy.count

    @property
    def num_pending(self) -> int:
        """Steps of all envs whose transition is not emitted yet."""
        return self.adder.num_pending

    def _as_obs(self, obs: Any) -> np.ndarray:
        return np.array(obs, dtype=self._obs_dtype)

    # -- the hooks (see the module docstring) -----------------------------
    def _begin_fragment(self) -> None:
        pass

    def _actions(self, t: int) -> np.ndarray:
        raise NotImplementedError

    def _episodes_ended(self, mask: np.ndarray) -> None:
        pass

    def _end_fragment(self) -> None:
        raise NotImplementedError

    def _begin_eval_episode(self) -> None:
        """A greedy evaluation episode begins (a recurrent policy resets its state)."""

    def _greedy(self, obs: np.ndarray) -> Any:
        raise NotImplementedError

    # -- rollouts -------------------------------------------------------
    def sample(self) -> Rollout:
        """Run ``fragment_length`` steps of every env; the completed transitions and stats.

        The :class:`~apex_dask.algo.rollout.spec.Rollout`'s batch holds env 0's
        transitions, then env 1's, and so on, each env's oldest first; ``steps``
        is ``fragment_length * num_envs`` less the steps env errors cut. The
        adder gets ``info["train_reward"]`` and ``info["train_terminated"]`` when
        the env gives them (clipped rewards, a life loss:
        :mod:`apex_dask.algo.envs.atari`); episode returns and lengths count raw
        rewards over whole episodes (``terminated or truncated``).
        """
        if self._obs is None:
            self._obs = self._envs.reset()
        adder = self.adder
        self._begin_fragment()
        returns: list[float] = []
        lengths: list[int] = []
        steps = 0
        for t in range(self.fragment_length):
            actions = self._actions(t)
            step = self._envs.step(actions)
            active = None if step.all_active else step.active
            adder.add(
                self._obs,
                actions,
                step.train_reward,
                step.next_obs,
                step.train_terminated,
                step.truncated,
                active,
                step.any_end,
            )
            self._clock += 1  # vector steps: an episode's length is the clock since its start
            if step.any_end or not step.all_active:
                steps += self._count_episodes(step, returns, lengths)
                self._episodes_ended(step.terminated | step.truncated | ~step.active)
            else:  # most steps
                self._episode_return += step.reward
                steps += self.num_envs
            self._obs = step.obs
        self._end_fragment()
        self.steps_sampled += steps
        batch, priorities = adder.take(self._obs, TRANSITION_KEYS)
        if self.frame_stack is not None:
            batch = encode_batch(batch, self.frame_stack)
        return Rollout(
            batch, priorities, steps, self.weights_version, self.exploration, returns, lengths
        )

    def _count_episodes(self, step: VectorStep, returns: list, lengths: list) -> int:
        """Episode stats of a step with episode ends or env errors (the envs whose step
        failed drop their partial episode); the steps made."""
        active, ended = step.active, step.terminated | step.truncated
        self._episode_return[active] += step.reward[active]
        done = np.flatnonzero(active & ended)
        returns += self._episode_return[done].tolist()
        lengths += (self._clock - self._episode_start[done]).tolist()
        self.episodes += len(done)
        restart = (active & ended) | ~active
        self._episode_return[restart], self._episode_start[restart] = 0.0, self._clock
        return int(active.sum())

    # -- evaluation -----------------------------------------------------
    def evaluate(
        self,
        num_episodes: int,
        seed: int | None = None,
        max_steps: int | None = None,
        timeout_s: float | None = None,
        frames: Any = None,
    ) -> dict[str, Any]:
        """Greedy episodes on a separate env (:func:`~apex_dask.algo.rollout.evaluation.greedy_episodes` documents it)."""
        from apex_dask.algo.rollout.evaluation import greedy_episodes

        return greedy_episodes(self, int(num_episodes), seed, max_steps, timeout_s, frames)

    def close(self) -> None:
        """Close the envs (a hung one once its call returns) and end their threads."""
        self._envs.close()
        if self._eval_env is not None:
            self._guard.discard(self._eval_env)
        self._guard.close()
