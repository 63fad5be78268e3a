"""Sequence replay items from env steps: R2D2's adder, one episode buffer per env.

::

    adder = SequenceAdder(num_envs=2, obs_shape=(2,), obs_dtype=np.float32,
                          burn_in=10, trace_length=20, period=10, state_size=64)
    adder.set_states(h, c, version)                 # the state each env acts from
    adder.add(obs, actions, reward, next_obs, terminated, truncated, active, any_end)
    batch, priorities = adder.take(last_obs)        # the items completed since the last take

An episode's steps are numbered ``i = 0, 1, ...``. Its traces start at ``s = 0, P,
2P, ...`` (``P`` = ``period``); the item of trace start ``s`` holds the ``T = B + L``
steps ``s - B .. s + L - 1`` (``B`` burn-in, ``L`` trace length) and the observation
after them. Positions before the episode (``s < B``) and after its end are padding:
zero observations, ``mask`` 0. An item is emitted once step ``s + L - 1`` is made
(its trace is full) or when its episode ends (terminated or truncated), whichever
comes first; at an episode's end every trace start still owed (``s < length``) is
emitted, padded. So consecutive items overlap by ``T - P`` steps, every step of an
episode is trained (in one trace or more), and no item spans two episodes.

Items cross fragment boundaries: the buffers live on from one :meth:`take` to the
next. An episode's final observation (after its last step) sits right after that
step: the learner bootstraps from it after a time limit (``done`` 0) and not after a
termination (``done`` 1). An env whose step failed (``active`` False) drops its
partial episode; items emitted before stay.

Each item's keys (see :mod:`apex_dask.algo.agents.r2d2.loss`): ``obs`` (T, ...),
``next_obs`` (...), ``action``, ``reward``, ``done``, ``mask``, ``first`` (T,),
``state`` (2, H): the ``(h, c)`` the env acted from at the first real step (marked by
``first``), and ``state_version``: the weights version that state was computed with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np

__all__ = ["SEQUENCE_KEYS", "SequenceAdder"]

SEQUENCE_KEYS: tuple[str, ...] = (
    "obs",
    "next_obs",
    "action",
    "reward",
    "done",
    "mask",
    "first",
    "state",
    "state_version",
)
"""The keys of a sequence item."""


class SequenceAdder:
    """Builds sequence items from vector env steps; see the module docstring.

    ``priority_fn(batch) -> float32 [n]`` gives the items' initial priorities at
    :meth:`take` (None: no priorities, the shard then gives its maximum).

    Each env's episode lives in rows of preallocated arrays (episode step ``i`` at row
    ``i - base``): a step is a few row writes per env, an item a copy of row slices.
    Fewer than ``T`` rows are still needed after an emission (no owed trace is full),
    and they move to the front when the steps up to the next emission would not fit.
    """

    def __init__(
        self,
        num_envs: int,
        obs_shape: tuple[int, ...],
        obs_dtype: np.dtype,
        *,
        burn_in: int,
        trace_length: int,
        period: int,
        state_size: int,
        priority_fn: Callable[[Mapping[str, np.ndarray]], np.ndarray] | None = None,
    ) -> None:
        if burn_in < 0 or trace_length < 1 or period < 1:
            raise ValueError(
                f"need burn_in >= 0, trace_length >= 1, period >= 1; got {burn_in}, "
                f"{trace_length}, {period}"
            )
        if period > trace_length:
            raise ValueError(
                f"period ({period}) must be <= trace_length ({trace_length}), or steps "
                "between traces would never be trained"
            )
        self.num_envs = n = int(num_envs)
        self.obs_shape, self.obs_dtype = tuple(obs_shape), np.dtype(obs_dtype)
        self.burn_in, self.trace_length, self.period = int(burn_in), int(trace_length), int(period)
        self.length = self.burn_in + self.trace_length
        self.state_size = int(state_size)
        self.priority_fn = priority_fn
        # rows per env: fewer than T are live after each step's emissions (see _trim)
        self._rows = rows = 2 * self.length + 2
        self._obs = np.zeros((n, rows + 1, *self.obs_shape), self.obs_dtype)  # o_base ..
        self._action = np.zeros((n, rows), np.int64)
        self._reward = np.zeros((n, rows), np.float32)
        self._done = np.zeros((n, rows), np.float32)
        self._h = np.zeros((n, rows, self.state_size), np.float32)  # the state before each step
        self._c = np.zeros((n, rows, self.state_size), np.float32)
        self._ver = np.zeros((n, rows), np.int64)
        self._base = [0] * n  # episode step of row 0
        self._steps = [0] * n  # steps made in the episode
        self._next = [0] * n  # the next trace start to emit
        self._items: list[dict[str, np.ndarray]] = []
        self._state_h = np.zeros((n, self.state_size), np.float32)
        self._state_c = np.zeros((n, self.state_size), np.float32)
        self._version = 0

    @property
    def num_pending(self) -> int:
        """Steps of all envs not yet in an emitted trace."""
        return sum(s - min(n, s) for s, n in zip(self._steps, self._next, strict=True))

    def set_states(self, h: np.ndarray, c: np.ndarray, version: int) -> None:
        """The ``(h, c)`` (each (N, H)) every env acts from at the coming step, computed
        with weights ``version``; read (copied) at the next :meth:`add`."""
        self._state_h, self._state_c = h, c
        self._version = int(version)

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        reward: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        active: np.ndarray | None = None,
        any_end: bool = True,
    ) -> None:
        """One vector step (each argument's first axis: the envs)."""
        steps, base, nxt = self._steps, self._base, self._next
        h, c, version, trace = self._state_h, self._state_c, self._version, self.trace_length
        for j in range(self.num_envs):
            if active is not None and not active[j]:
                steps[j] = base[j] = nxt[j] = 0  # the partial episode is dropped
                continue
            i = steps[j]
            r = i - base[j]
            if i == 0:
                self._obs[j, 0] = obs[j]
            self._obs[j, r + 1] = next_obs[j]
            self._action[j, r] = actions[j]
            self._reward[j, r] = reward[j]
            self._done[j, r] = terminated[j]
            self._h[j, r] = h[j]
            self._c[j, r] = c[j]
            self._ver[j, r] = version
            steps[j] = i = i + 1
            if terminated[j] or truncated[j]:
                while nxt[j] < i:
                    self._emit(j, nxt[j])
                    nxt[j] += self.period
                steps[j] = base[j] = nxt[j] = 0
            elif nxt[j] + trace <= i:
                while nxt[j] + trace <= i:
                    self._emit(j, nxt[j])
                    nxt[j] += self.period
                self._trim(j)

    def _trim(self, j: int) -> None:
        """Move env ``j``'s rows that an item still owed needs (from ``next_start - B``) to
        the front unless the steps up to its next emission (at most ``P``) fit."""
        if self._steps[j] - self._base[j] + self.period <= self._rows:
            return  # the steps up to the next emission fit
        keep_from = self._next[j] - self.burn_in
        drop = keep_from - self._base[j]
        live = self._steps[j] - keep_from  # < T: no trace start owed is full
        for buf in (self._action, self._reward, self._done, self._h, self._c, self._ver):
            buf[j, :live] = buf[j, drop : drop + live].copy()
        self._obs[j, : live + 1] = self._obs[j, drop : drop + live + 1].copy()
        self._base[j] = keep_from

    def _emit(self, j: int, start: int) -> None:
        """Env ``j``'s item of trace start ``start``: steps ``start - B .. start + L - 1``."""
        t = self.length
        lo = start - self.burn_in  # episode step of position 0
        first_pos = max(0, -lo)  # position of the first real step
        steps_to = min(t, self._steps[j] - lo)  # positions < steps_to hold real steps
        obs_to = min(t + 1, self._steps[j] + 1 - lo)  # positions < obs_to: observations
        r0 = lo + first_pos - self._base[j]  # the row of the first real step
        obs = np.zeros((t + 1, *self.obs_shape), self.obs_dtype)
        obs[first_pos:obs_to] = self._obs[j, r0 : r0 + obs_to - first_pos]
        item = {"obs": obs[:t], "next_obs": obs[t]}
        n = steps_to - first_pos
        for key, buf, dtype in (
            ("action", self._action, np.int64),
            ("reward", self._reward, np.float32),
            ("done", self._done, np.float32),
        ):
            value = np.zeros(t, dtype)
            value[first_pos:steps_to] = buf[j, r0 : r0 + n]
            item[key] = value
        item["mask"] = np.zeros(t, np.float32)
        item["mask"][first_pos:steps_to] = 1.0
        item["first"] = np.zeros(t, np.float32)
        item["first"][first_pos] = 1.0
        item["state"] = np.stack([self._h[j, r0], self._c[j, r0]])
        item["state_version"] = np.int64(self._ver[j, r0])
        self._items.append(item)

    def take(
        self, last_obs: np.ndarray | None = None, keys: Iterable[str] = SEQUENCE_KEYS
    ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """The items emitted since the last take (stacked, first axis the items) and their
        initial priorities. ``last_obs`` and ``keys`` are unused (the transition adders'
        signature)."""
        items, self._items = self._items, []
        t = self.length
        if items:
            batch = {k: np.stack([it[k] for it in items]) for k in SEQUENCE_KEYS}
        else:
            batch = {
                "obs": np.zeros((0, t, *self.obs_shape), self.obs_dtype),
                "next_obs": np.zeros((0, *self.obs_shape), self.obs_dtype),
                "action": np.zeros((0, t), np.int64),
                **{k: np.zeros((0, t), np.float32) for k in ("reward", "done", "mask", "first")},
                "state": np.zeros((0, 2, self.state_size), np.float32),
                "state_version": np.zeros(0, np.int64),
            }
        if self.priority_fn is None:
            return batch, None
        if not items:
            return batch, np.zeros(0, np.float32)
        return batch, np.asarray(self.priority_fn(batch), np.float32)
