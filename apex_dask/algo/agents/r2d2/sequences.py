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
from dataclasses import dataclass, field

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


@dataclass
class _Episode:
    """One env's episode so far: entries from episode step ``base`` on."""

    obs: list[np.ndarray] = field(default_factory=list)  # o_base .. o_length
    action: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    done: list[bool] = field(default_factory=list)
    state: list[np.ndarray] = field(default_factory=list)  # (2, H) before each step
    version: list[int] = field(default_factory=list)
    base: int = 0
    length: int = 0  # steps made
    next_start: int = 0  # the next trace start to emit


class SequenceAdder:
    """Builds sequence items from vector env steps; see the module docstring.

    ``priority_fn(batch) -> float32 [n]`` gives the items' initial priorities at
    :meth:`take` (None: no priorities, the shard then gives its maximum).
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
        self.num_envs = int(num_envs)
        self.obs_shape, self.obs_dtype = tuple(obs_shape), np.dtype(obs_dtype)
        self.burn_in, self.trace_length, self.period = int(burn_in), int(trace_length), int(period)
        self.length = self.burn_in + self.trace_length
        self.state_size = int(state_size)
        self.priority_fn = priority_fn
        self._episodes = [_Episode() for _ in range(self.num_envs)]
        self._items: list[dict[str, np.ndarray]] = []
        self._state = np.zeros((self.num_envs, 2, self.state_size), np.float32)
        self._version = 0

    @property
    def num_pending(self) -> int:
        """Steps of all envs not yet in an emitted trace."""
        return sum(e.length - min(e.next_start, e.length) for e in self._episodes)

    def set_states(self, h: np.ndarray, c: np.ndarray, version: int) -> None:
        """The ``(h, c)`` (each (N, H)) every env acts from at the coming step, computed
        with weights ``version``."""
        self._state = np.stack([np.asarray(h, np.float32), np.asarray(c, np.float32)], axis=1)
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
        for j, ep in enumerate(self._episodes):
            if active is not None and not active[j]:
                self._episodes[j] = _Episode()  # the partial episode is dropped
                continue
            if not ep.obs:
                ep.obs.append(np.array(obs[j], self.obs_dtype))
            ep.action.append(int(actions[j]))
            ep.reward.append(float(reward[j]))
            ep.done.append(bool(terminated[j]))
            ep.state.append(self._state[j].copy())
            ep.version.append(self._version)
            ep.obs.append(np.array(next_obs[j], self.obs_dtype))
            ep.length += 1
            if terminated[j] or truncated[j]:
                while ep.next_start < ep.length:
                    self._emit(ep, ep.next_start)
                    ep.next_start += self.period
                self._episodes[j] = _Episode()
                continue
            while ep.next_start + self.trace_length <= ep.length:
                self._emit(ep, ep.next_start)
                ep.next_start += self.period
            self._trim(ep)

    def _trim(self, ep: _Episode) -> None:
        """Drop the entries no item still owed needs (before ``next_start - B``)."""
        keep_from = ep.next_start - self.burn_in
        drop = keep_from - ep.base
        if drop > 0:
            del ep.obs[:drop], ep.action[:drop], ep.reward[:drop], ep.done[:drop]
            del ep.state[:drop], ep.version[:drop]
            ep.base = keep_from

    def _emit(self, ep: _Episode, start: int) -> None:
        """The item of trace start ``start``: steps ``start - B .. start + L - 1``."""
        t = self.length
        lo = start - self.burn_in  # episode step of position 0
        item = {
            "obs": np.zeros((t + 1, *self.obs_shape), self.obs_dtype),
            "action": np.zeros(t, np.int64),
            "reward": np.zeros(t, np.float32),
            "done": np.zeros(t, np.float32),
            "mask": np.zeros(t, np.float32),
            "first": np.zeros(t, np.float32),
        }
        first_pos = max(0, -lo)  # position of the first real step
        steps_to = min(t, ep.length - lo)  # positions < steps_to hold real steps
        obs_to = min(t + 1, ep.length + 1 - lo)  # positions < obs_to hold observations
        b = ep.base
        for p in range(first_pos, obs_to):
            item["obs"][p] = ep.obs[lo + p - b]
        for p in range(first_pos, steps_to):
            i = lo + p - b
            item["action"][p] = ep.action[i]
            item["reward"][p] = ep.reward[i]
            item["done"][p] = ep.done[i]
            item["mask"][p] = 1.0
        item["first"][first_pos] = 1.0
        obs = item.pop("obs")
        item["obs"], item["next_obs"] = obs[:t], obs[t]
        item["state"] = ep.state[lo + first_pos - b].copy()
        item["state_version"] = np.int64(ep.version[lo + first_pos - b])
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
