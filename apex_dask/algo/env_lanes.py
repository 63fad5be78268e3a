"""An env worker's envs in lanes: stepping overlapped with acting (double buffering).

An :class:`~apex_dask.algo.env_worker.EnvWorker` steps its ``N`` envs in one
lane, or, with ``double_buffer`` (``workers.double_buffer``) and envs that step
outside the acting thread (ale-py's C++ vector env, ``vector_mode="native"``),
in two: envs ``[0, h)`` and ``[h, N)`` with ``h = ceil(N / 2)``, each a vector
env of its own. A lane's vector step is started (``send``: the games step on
ale-py's thread) and collected later (``recv``), so that the network acts for
one lane while the other lane's envs step, as Sample Factory's double-buffered
sampling does::

    for t in range(fragment_length):
        for lane in lanes:                        # lane A, then lane B
            if lane.in_flight:
                lane.receive(returns, lengths)    # its step t - 1
            q = lane.forward(q_values)            # the other lane steps meanwhile
            lane.send(epsilon_greedy(q))
    for lane in lanes:                            # the fragment's end: all received
        lane.receive(returns, lengths)
        lane.forward(q_values, keep=True)         # the next fragment's first actions

With one lane this is the plain step-then-act loop. Each lane owns a
:class:`~apex_dask.algo.vector_nstep.VectorNStepAdder`, its Q-values and its
episode stats, so a lane's transitions and priorities are exactly those its
envs would give in one lane: a priority uses ``Q(s_t)[a_t]`` of the pass that
acted on ``s_t`` and the bootstrap value of the pass that acts on ``s_{t+k}``.
No step is in flight between fragments, so every pass of a fragment uses the
weights it started with (:meth:`Lane.new_weights` comes between fragments).
Env errors stay per lane: a native lane's vector env is made again whole, the
other lane is not touched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from apex_dask.algo.env_set import VectorStep
from apex_dask.algo.vector_nstep import VectorNStepAdder

__all__ = ["Lane", "VectorEnvs", "lane_bounds"]


class VectorEnvs(Protocol):
    """What a lane steps: :class:`~apex_dask.algo.env_set.GuardedEnvs` or
    :class:`~apex_dask.algo.native_envs.NativeAtariEnvs`."""

    envs: list[Any]

    def reset(self) -> np.ndarray: ...
    def send(self, actions: np.ndarray) -> None: ...
    def recv(self) -> VectorStep: ...
    def close(self) -> None: ...


def lane_bounds(num_envs: int, lanes: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` env ranges of ``lanes`` lanes over ``num_envs`` envs (the first the largest)."""
    cuts = [-(-num_envs * i // lanes) for i in range(lanes + 1)]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


class Lane:
    """Envs ``[lo, hi)`` of a worker, stepped together; see the module docstring.

    ``make_envs(lo, hi)`` makes them (at :meth:`start`) unless ``envs`` is given.
    """

    def __init__(
        self,
        lo: int,
        hi: int,
        make_envs: Callable[[int, int], VectorEnvs],
        adder: VectorNStepAdder,
        envs: VectorEnvs | None = None,
    ) -> None:
        self.lo, self.hi, self.num_envs = lo, hi, hi - lo
        self.adder = adder
        self._make_envs = make_envs
        self.envs = envs
        self.obs: np.ndarray | None = None  # what the envs act on next
        self.actions: np.ndarray | None = None  # sent, not yet received
        self._q_next: np.ndarray | None = None  # Q of self.obs under the current weights
        self._requote = False
        self._episode_return = np.zeros(self.num_envs)
        self._episode_start = np.zeros(self.num_envs, np.int64)  # the clock when it began
        self._clock = 0  # vector steps: an episode's length is the clock since its start

    @property
    def in_flight(self) -> bool:
        return self.actions is not None

    def start(self) -> None:
        """Make the envs (if not yet) and reset them (once)."""
        if self.envs is None:
            self.envs = self._make_envs(self.lo, self.hi)
        if self.obs is None:
            self.obs = self.envs.reset()

    def new_weights(self) -> None:
        """The Q-values kept were of the old weights: computed again at the next pass."""
        self._q_next = None
        self._requote = True  # the pending steps' Q(s_t)[a_t] too

    def send(self, actions: np.ndarray) -> None:
        """Start a step of every env of the lane."""
        self.actions = actions
        self.envs.send(actions)

    def receive(self, returns: list, lengths: list) -> int:
        """Collect the step :meth:`send` started: to the adder and the episode stats (ended
        episodes appended to ``returns`` and ``lengths``); the env steps made."""
        step, actions, self.actions = self.envs.recv(), self.actions, None
        active = None if step.all_active else step.active
        self.adder.add(
            self.obs,
            actions,
            step.train_reward,
            step.next_obs,
            step.train_terminated,
            step.truncated,
            active,
            step.any_end,
        )
        self._clock += 1
        self.obs = step.obs
        if not step.any_end and step.all_active:  # most steps
            self._episode_return += step.reward
            return self.num_envs
        return self._count_episodes(step, returns, lengths)

    def _count_episodes(self, step: VectorStep, returns: list, lengths: list) -> int:
        """Episode stats of a step with episode ends or env errors (the envs whose step
        failed drop their partial episode); the steps made."""
        active, ended = step.active, step.terminated | step.truncated
        self._episode_return[active] += step.reward[active]
        done = np.flatnonzero(active & ended)
        returns += self._episode_return[done].tolist()
        lengths += (self._clock - self._episode_start[done]).tolist()
        restart = (active & ended) | ~active
        self._episode_return[restart], self._episode_start[restart] = 0.0, self._clock
        return int(active.sum())

    def forward(self, q_values: Callable[[np.ndarray], np.ndarray], keep: bool = False) -> Any:
        """Q-values of the envs' observations (one pass, with the last step's time-limit
        final observations and, after new weights, the pending steps as extra rows); their
        values go to the adder. ``keep``: the pass at a fragment's end, kept for the next
        fragment's first step."""
        n, adder = self.num_envs, self.adder
        cached, self._q_next = self._q_next, None
        finals = len(adder.finals())
        if cached is not None and not finals:
            adder.set_q(cached)
            return cached
        parts = [self.obs, adder.final_obs()] if finals else [self.obs]
        pending = 0
        if self._requote:  # new weights: the pending steps' Q(s_t)[a_t] too, same pass
            self._requote = False
            obs, actions = adder.pending_obs()
            pending = len(actions)
            if pending:
                parts.append(obs)
        q = q_values(np.concatenate(parts) if len(parts) > 1 else parts[0])
        if pending:
            adder.set_pending_q(q[len(q) - pending :])
        q_envs = q[:n]
        adder.set_q(q_envs, q[n : n + finals] if finals else None)
        if keep:
            self._q_next = q_envs
        return q_envs

    def take(self, keys: tuple[str, ...]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The transitions completed since the last take and their priorities."""
        return self.adder.take(self.obs, keys)

    def close(self) -> None:
        if self.envs is not None:
            self.envs.close()
