"""An epsilon-greedy env worker: rollouts with n-step transitions and initial priorities.

Usage loop (a runner or actor drives it)::

    worker = EnvWorker(make_env_factory("CartPole-v1"), epsilon=0.4, seed=1)
    worker.set_weights(*learner.get_weights())
    rollout = worker.sample()         # fragment_length env steps
    shard.add(rollout["batch"], rollout["priorities"])

Batched acting: a worker steps ``num_envs`` envs of its own together
(``workers.envs_per_worker``; RLlib's tuned Atari Ape-X ran 8): gymnasium envs
in turn (``vector_mode="sync"``, :mod:`apex_dask.algo.env_set`) or, for ALE
games with ``vector_mode="native"``, ale-py's C++ vector env
(:mod:`apex_dask.algo.native_envs`). It makes **one forward pass per step** over
all of them, the exploring ones too. With ``double_buffer`` (native envs, two or
more of them) the envs are split into two lanes, each its own vector env, and
the network acts for one lane while the other lane's games step on ale-py's
thread (:mod:`apex_dask.algo.env_lanes`): one pass per lane and step, same
transitions and priorities. For each env, with probability
``epsilon`` a uniform random action (drawn from the worker's own seeded
``numpy.random.Generator``), else ``argmax_a Q(s, a)`` under the last synced
weights. Vector observations use a numpy forward pass
(:class:`~apex_dask.algo.networks.NumpyMLPQ`), images go through torch. The
caller should run ``torch.set_num_threads(1)`` in the worker's process:
small-batch forwards are slower with more threads.

Steps go through a :class:`~apex_dask.algo.vector_nstep.VectorNStepAdder` per
lane (n-step transitions over the env and time axes, worked out once per
fragment) whose pending steps carry over
between fragments, so a fragment holds the transitions *completed* during
its steps (about ``fragment_length`` per env, not exactly).

Initial priorities come from the Q-values of acting, as the Ape-X paper's
actors do: each step keeps ``Q(s_t)[a_t]`` with its transition, and a
transition's bootstrap value ``max_b Q(s_{t+k}, b)`` is read from the
forward pass that acts on ``s_{t+k}`` (the step after it completes). A time
limit's final observation is never acted on: those states ride along as
extra rows of the next forward. The transitions that bootstrap from the
fragment's last observations get them from one batched pass at the end of
the fragment, whose Q-values also choose the next fragment's first actions
(unless :meth:`set_weights` came in between). So a pass costs nothing
extra per fragment, every transition ships in the fragment that completed
it, and all of a fragment's priorities come from the weights it acted
with. The priorities equal ``td_errors(batch)``: |td| with the double-DQN
target, online = target = the synced weights,
``|R + discount * Q(s', argmax_b Q(s', b)) - Q(s, a)|``.

Frame stacks: with ``frame_stack=k`` (observations ``[k, *frame_shape]``, as
gymnasium's ``FrameStackObservation`` makes them) the rollout's batch is sent
in the compact form of :mod:`apex_dask.algo.frame_codec` (each frame once),
which a shard built with the same ``frame_stack`` stores as it is.

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

from apex_dask.algo.env_guard import EnvErrorPolicy, EnvGuard, env_name
from apex_dask.algo.env_lanes import Lane, lane_bounds
from apex_dask.algo.env_set import REMAKE_TRIES, GuardedEnvs
from apex_dask.algo.frame_codec import encode_batch
from apex_dask.algo.learner import module_weights
from apex_dask.algo.loss import td_errors_numpy
from apex_dask.algo.native_envs import NativeAtariEnvs, native_game
from apex_dask.algo.networks import NumpyMLPQ, build_q_network
from apex_dask.algo.nstep import TRANSITION_KEYS
from apex_dask.algo.vector_nstep import VectorNStepAdder

__all__ = ["REMAKE_TRIES", "VECTOR_MODES", "EnvWorker", "probe_spaces"]

VECTOR_MODES = ("native", "sync")
"""How a worker steps its envs: ``native`` (ALE games: ale-py's ``AtariVectorEnv``,
:mod:`apex_dask.algo.native_envs`; other envs as ``sync``) or ``sync`` (gymnasium envs
stepped in turn, :class:`~apex_dask.algo.env_set.GuardedEnvs`)."""


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
    """Envs plus an epsilon-greedy policy; see the module docstring.

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
        vector_mode: str = "sync",
        double_buffer: bool = False,
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
        self.seed = int(seed)
        self.rng = np.random.default_rng(seed)
        if vector_mode not in VECTOR_MODES:
            raise ValueError(f"vector_mode must be one of {VECTOR_MODES}, got {vector_mode!r}")
        native = vector_mode == "native" and native_game(env_factory) is not None
        self.vector_mode = "native" if native else "sync"
        # two lanes only where the envs step on threads of their own (env_lanes.py)
        self.double_buffer = bool(double_buffer) and native and self.num_envs >= 2
        envs_class = NativeAtariEnvs if native else GuardedEnvs

        def make_envs(lo: int, hi: int) -> Any:  # env j resets first with seed + j
            return envs_class(
                env_factory,
                num_envs=hi - lo,
                seed=self.seed + lo,
                guard=self._guard,
                policy=self.policy,
                rng=self.rng,
                where=where,
            )

        bounds = lane_bounds(self.num_envs, 2 if self.double_buffer else 1)
        self._envs = make_envs(*bounds[0])  # the first lane's (an evaluator needs no more)
        self.observation_space = self._envs.observation_space
        self.action_space = self._envs.action_space
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self._net = build_q_network(self.observation_space, self.action_space, hiddens, dueling)
        self._net.eval()
        self._numpy_net: NumpyMLPQ | None = None
        if len(self.observation_space.shape) == 1:
            self._numpy_net = NumpyMLPQ(module_weights(self._net))
        self.epsilon = float(epsilon)
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
        self._eval_rng = np.random.default_rng([seed, 1])
        self._eval_env: gym.Env | None = None
        self._eval_steps = 0
        self._lanes = [
            Lane(
                lo,
                hi,
                make_envs,
                VectorNStepAdder(
                    hi - lo,
                    n_step,
                    gamma,
                    self._obs_shape,
                    self._obs_dtype,
                    self.fragment_length,
                    num_actions=self.num_actions,
                ),
                self._envs if lo == 0 else None,
            )
            for lo, hi in bounds
        ]
        self.weights_version = -1
        self.steps_sampled = 0
        self.episodes = 0

    @property
    def envs(self) -> list[gym.Env]:
        """The worker's envs (only the first before the first :meth:`sample`)."""
        return [env for lane in self._lanes if lane.envs is not None for env in lane.envs.envs]

    @property
    def env(self) -> gym.Env:  # the first env
        return self._envs.envs[0]

    @property
    def env_errors(self) -> int:
        """Env errors survived or not (raised, hung, non-finite), all envs of this worker."""
        return self.policy.count

    @property
    def num_pending(self) -> int:
        """Steps of all envs whose transition is not emitted yet."""
        return sum(lane.adder.num_pending for lane in self._lanes)

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

    def _explore(self) -> tuple[np.ndarray, np.ndarray] | None:
        """A fragment's exploration draws: (explore?, random action) per step and env."""
        if self.epsilon == 0.0:
            return None
        shape = (self.fragment_length, self.num_envs)
        return self.rng.random(shape) < self.epsilon, self.rng.integers(
            self.num_actions, size=shape
        )

    def set_weights(self, version: int, weights: Mapping[str, np.ndarray]) -> None:
        """Act with these weights (a learner's ``get_weights()``) from now on."""
        if self._numpy_net is not None:
            self._numpy_net = NumpyMLPQ(weights)
        else:
            self._net.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})
        self.weights_version = int(version)
        for lane in self._lanes:  # the kept Q-values and the pending steps' Q(s_t)[a_t]
            lane.new_weights()

    # -- rollouts -------------------------------------------------------
    def sample(self) -> dict[str, Any]:
        """Run ``fragment_length`` steps of every env; return the completed transitions and stats.

        Keys: ``batch`` (``obs, action, reward, next_obs, done, discount`` arrays;
        with ``frame_stack``: ``frames, obs_refs, action, reward, next_obs_refs,
        done, discount``), ``priorities`` (float32 |td|), ``steps`` (env steps made:
        ``fragment_length * num_envs`` less those env errors cut), ``episode_returns``,
        ``episode_lengths``, ``weights_version``, ``epsilon``.

        The batch holds env 0's transitions, then env 1's, and so on, each env's
        oldest first. The adder gets ``info["train_reward"]`` and
        ``info["train_terminated"]`` when the env gives them (clipped rewards,
        a life loss: :mod:`apex_dask.algo.atari`); episode returns and lengths
        count raw rewards over whole episodes (``terminated or truncated``).
        """
        lanes = self._lanes
        for lane in lanes:
            lane.start()
        draws = self._explore()
        explore = [False] * self.fragment_length if draws is None else draws[0].any(1).tolist()
        returns: list[float] = []
        lengths: list[int] = []
        steps = 0
        for t in range(self.fragment_length):
            for lane in lanes:  # two lanes: one lane's envs step while the other's act
                if lane.in_flight:
                    steps += lane.receive(returns, lengths)
                actions = lane.forward(self.q_values).argmax(axis=1)
                if explore[t]:  # epsilon-greedy with the fragment's draws
                    cols = slice(lane.lo, lane.hi)
                    actions = np.where(draws[0][t, cols], draws[1][t, cols], actions)
                lane.send(actions)
        for lane in lanes:
            steps += lane.receive(returns, lengths)
            lane.forward(self.q_values, keep=True)  # the next fragment's first actions
        self.steps_sampled += steps
        self.episodes += len(returns)
        parts = [lane.take(TRANSITION_KEYS) for lane in lanes]
        batch, priorities = parts[0]
        if len(parts) > 1:  # env-major still: lane A's envs come first
            batch = {k: np.concatenate([b[k] for b, _ in parts]) for k in batch}
            priorities = np.concatenate([p for _, p in parts])
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
        """float32 |td| of a batch under the synced weights (online = target), from two
        new passes: what :meth:`sample`'s priorities equal, made from its acting passes."""
        n = len(batch["action"])
        if n == 0:
            return np.zeros(0, np.float32)
        q_all = self.q_values(np.concatenate([batch["obs"], batch["next_obs"]]))
        q, q_next = q_all[:n], q_all[n:]
        b = batch
        return td_errors_numpy(
            q, q_next, q_next, b["action"], b["reward"], b["discount"], self.double_q
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
        for lane in self._lanes:
            lane.close()
        if self._eval_env is not None:
            self._guard.discard(self._eval_env)
        self._guard.close()
