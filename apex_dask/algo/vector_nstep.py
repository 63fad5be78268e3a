"""n-step transitions of N envs stepped together, with their initial priorities.

:class:`VectorNStepAdder` is :class:`~apex_dask.algo.nstep.NStepAdder` over
the env axis: one :meth:`~VectorNStepAdder.add` per vector step takes the N
envs' ``(s_t, a_t, r_t, s_{t+1}, terminated, truncated)`` as arrays and
returns the transitions that step completes, the same ones (same values,
same order within each env) as N scalar adders would. Pending steps live in
ring buffers of n slots, step t in slot ``t mod n`` for every env; env j has
``count[j]`` pending steps, the last ones written. The maths is the scalar
adder's (:mod:`apex_dask.algo.nstep`):

    R_{t:t+k} = sum_{i=0}^{k-1} gamma^i r_{t+i}     (summed oldest first, float64)
    discount  = 0 after a termination, else gamma^k

Each step also keeps ``Q(s_t)[a_t]``, the acting forward's Q-value of the
action taken, so that a transition's initial priority needs no new pass
over ``s_t``: :class:`PriorityFragment` collects a fragment's transitions and
completes each priority once the Q-values of its bootstrap state are known:

    |td| = |R + discount * max_b Q(s_{t+k}, b) - Q(s_t)[a_t]|

which is the double-DQN target of :func:`apex_dask.algo.loss.td_errors_numpy`
with online = target (an env worker's one set of weights): the target net's
value of the online argmax is then the max. A transition that does not
bootstrap (``discount == 0``) has |td| = |R - Q(s_t)[a_t]|.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["PriorityFragment", "VectorNStepAdder"]

Block = dict[str, np.ndarray]
"""Transitions as arrays: ``env, obs, action, reward, next_obs, done, discount, q_taken``."""


class VectorNStepAdder:
    """n-step transitions of ``num_envs`` envs at once; see the module docstring."""

    def __init__(
        self, num_envs: int, n_step: int, gamma: float, obs_shape: tuple, obs_dtype: Any
    ) -> None:
        if int(n_step) < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step!r}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
        n, m = int(n_step), int(num_envs)
        self.n_step, self.num_envs, self.gamma = n, m, float(gamma)
        self._powers = [self.gamma**i for i in range(n + 1)]
        self._obs = np.zeros((n, m, *obs_shape), dtype=obs_dtype)
        self._action = np.zeros((n, m), np.int64)
        self._reward = np.zeros((n, m), np.float64)
        self._q = np.zeros((n, m), np.float32)
        self._count = np.zeros(m, np.int64)
        self._t = 0

    @property
    def num_pending(self) -> int:
        """Steps of all envs whose transition is not emitted yet (< n_step each)."""
        return int(self._count.sum())

    def pending(self) -> np.ndarray:
        """Pending steps per env (a copy)."""
        return self._count.copy()

    def pending_obs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(obs, actions)`` of every pending step (for new Q-values: :meth:`set_q_taken`)."""
        slots, env = self._pending_index()
        return self._obs[slots, env], self._action[slots, env]

    def set_q_taken(self, q_taken: np.ndarray) -> None:
        """Replace the kept Q(s_t)[a_t] of the pending steps (in :meth:`pending_obs` order):
        new weights make new priorities for the steps still to complete."""
        slots, env = self._pending_index()
        self._q[slots, env] = q_taken

    def _pending_index(self) -> tuple[np.ndarray, np.ndarray]:
        n, t = self.n_step, self._t
        back = np.arange(1, n + 1)[:, None]  # steps t-1, t-2, ... (t: the next step's slot)
        live = back <= self._count[None, :]
        slots = np.broadcast_to((t - back) % n, live.shape)[live]
        env = np.broadcast_to(np.arange(self.num_envs)[None, :], live.shape)[live]
        return slots, env

    def reset(self, env: int | None = None) -> None:
        """Drop the pending steps of ``env`` (all envs: None) without emitting them."""
        if env is None:
            self._count[:] = 0
        else:
            self._count[env] = 0

    def add(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        q_taken: np.ndarray | None = None,
        active: np.ndarray | None = None,
    ) -> Block | None:
        """Record one step of every env (arrays over the env axis); return the
        transitions it completes (env-major, oldest first within an env), or None.

        ``active`` (bool per env, default all): envs whose step is left out
        (an env error) write nothing and emit nothing.
        """
        n, t = self.n_step, self._t
        slot = t % n
        on = slice(None) if active is None else np.asarray(active, bool)
        self._obs[slot][on] = obs[on]
        self._action[slot][on] = action[on]
        self._reward[slot][on] = reward[on]
        if q_taken is not None:
            self._q[slot][on] = q_taken[on]
        self._t = t + 1
        count = self._count
        count[on] += 1
        ended = np.asarray(terminated, bool) | np.asarray(truncated, bool)
        if active is not None:
            ended &= on
        full = (count == n) & ~ended
        if not ended.any() and not full.any():
            return None
        # chronological view of the slots: row i is step t - n + 1 + i
        rows = [(t - n + 1 + i) % n for i in range(n)]
        if not ended.any():  # mid-episode: the oldest step of each full env
            env_all = np.flatnonzero(full)
            ret = np.zeros(len(env_all))
            for m in range(n):
                ret += self._powers[m] * self._reward[rows[m], env_all]
            count[full] -= 1
            return self._block(rows[0], env_all, ret, next_obs, np.zeros(len(env_all), bool), n)
        env_ix, start = [], []
        for i in range(n):  # a start i is pending where count >= n - i
            mask = (ended & (count >= n - i)) | (full & (i == 0))
            idx = np.flatnonzero(mask)
            env_ix.append(idx)
            start.append(np.full(len(idx), i))
        env_all, start_all = np.concatenate(env_ix), np.concatenate(start)
        order = np.lexsort((start_all, env_all))
        env_all, start_all = env_all[order], start_all[order]
        k = n - start_all  # steps summed: the steps left to the episode's end
        ret = np.zeros(len(env_all))
        for i in range(n):  # R = sum_m gamma^m r_{start+m}, oldest first as the scalar adder
            pick = np.flatnonzero(start_all == i)
            for m in range(n - i if len(pick) else 0):
                ret[pick] += self._powers[m] * self._reward[rows[i + m], env_all[pick]]
        slots = np.asarray(rows)[start_all]
        term = np.asarray(terminated, bool)[env_all]
        block = self._block(slots, env_all, ret, next_obs, term, k)
        count[ended] = 0
        count[full] -= 1
        return block

    def _block(
        self,
        slots: Any,
        env: np.ndarray,
        ret: np.ndarray,
        next_obs: np.ndarray,
        done: np.ndarray,
        k: Any,
    ) -> Block:
        return {
            "env": env,
            "obs": self._obs[slots, env],
            "action": self._action[slots, env],
            "reward": ret.astype(np.float32),
            "next_obs": next_obs[env],
            "done": done,
            "discount": np.where(done, 0.0, np.asarray(self._powers)[k]).astype(np.float32),
            "q_taken": self._q[slots, env],
        }


class PriorityFragment:
    """A fragment's transitions, their priorities completed by later forward passes.

    Usage, once per vector step::

        q = net(inputs)                       # rows: the envs' obs, then extra states
        fragment.resolve(q)                   # the last step's transitions get |td|
        ...                                   # act, step, adder.add(...) -> block
        fragment.add(block, boot_rows)        # row of q each one bootstraps from, -1: none

    and after the fragment's last step one more ``resolve`` with the Q-values
    of its last observations. :meth:`take` returns the batch (env-major,
    oldest first) and the priorities.
    """

    def __init__(self) -> None:
        self._blocks: list[Block] = []
        self._prios: list[np.ndarray] = []
        self._waiting: tuple[Block, np.ndarray] | None = None

    def add(self, block: Block | None, boot_rows: np.ndarray) -> None:
        """Keep ``block`` until the next :meth:`resolve`; ``boot_rows[i]`` is the row of
        the next forward's Q-values that transition i bootstraps from (-1: it does not)."""
        if self._waiting is not None:
            raise RuntimeError("resolve() the previous step's transitions first")
        if block is not None:
            self._waiting = (block, np.asarray(boot_rows, np.int64))

    def resolve(self, q: np.ndarray) -> None:
        """Complete the waiting transitions' |td| from the Q-values ``q`` (rows, actions)."""
        if self._waiting is None:
            return
        block, rows = self._waiting
        self._waiting = None
        value = np.zeros(len(rows), np.float32)
        boots = rows >= 0
        if boots.any():
            value[boots] = q[rows[boots]].max(axis=1)
        y = block["reward"] + block["discount"] * value
        self._blocks.append(block)
        self._prios.append(np.abs(block["q_taken"] - y).astype(np.float32))

    @property
    def waiting(self) -> bool:
        """Whether transitions wait for a :meth:`resolve`."""
        return self._waiting is not None

    def take(self, keys: tuple[str, ...]) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
        """The batch of ``keys`` (env-major, oldest first) and its priorities, then empty;
        None if no transition was made."""
        if self._waiting is not None:
            raise RuntimeError("resolve() the last step's transitions before take()")
        if not self._blocks:
            return None
        blocks, prios = self._blocks, self._prios
        self._blocks, self._prios = [], []
        env = np.concatenate([b["env"] for b in blocks])
        order = np.argsort(env, kind="stable")
        batch = {key: np.concatenate([b[key] for b in blocks])[order] for key in keys}
        return batch, np.concatenate(prios)[order]
