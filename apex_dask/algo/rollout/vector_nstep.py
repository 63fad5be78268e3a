"""n-step transitions of N envs stepped together, with their initial priorities.

:class:`VectorNStepAdder` does what one :class:`~apex_dask.algo.rollout.nstep.NStepAdder`
per env does, over the env axis *and* the time axis: each vector step is
recorded with a few array writes (:meth:`~VectorNStepAdder.add`), and
:meth:`~VectorNStepAdder.take` works out every transition the steps since the
last ``take`` completed, with numpy over all (step, env) pairs at once. So a
step costs no Python per env, and nothing per emitted transition. The
transitions are the scalar adders' (same values bit for bit, same order
within each env: env-major, oldest first). The maths (:mod:`apex_dask.algo.rollout.nstep`):

    R_{t:t+k} = sum_{i=0}^{k-1} gamma^i r_{t+i}     (summed oldest first, float64)
    discount  = 0 after a termination, else gamma^k
    k         = n, or the steps left to the episode's end (a termination or time limit)

A step whose ``active`` is False (an env error) is left out, and the steps of
that env still pending before it are dropped (their returns would cross an
env that was made again). Steps not complete at a ``take`` stay pending:
at most ``n - 1`` per env carry over to the next fragment, so a fragment
cut never shortens a return.

Initial priorities come from the Q-values of acting, as the Ape-X paper's
actors do: :meth:`~VectorNStepAdder.set_q` keeps the acting pass's
``Q(s_t, .)`` of the states the envs act on (and of the final observations
of the last step's time limits, which no env acts on:
:meth:`~VectorNStepAdder.final_obs`), so that at a take

    |td| = |R + discount * max_b Q(s_{t+k}, b) - Q(s_t)[a_t]|

needs no new pass. This is the double-DQN target of
:func:`apex_dask.algo.agents.dqn.loss.td_errors_numpy` with online = target (an env
worker's one set of weights): the target net's value of the online argmax
is then the max. A step that did not end must have ``next_obs`` equal to
the next step's ``obs`` (only the final observations of ends are kept).
Usage, once per vector step::

    extra = [adder.final_obs()] if len(adder.finals()) else []
    q = net(np.concatenate([obs, *extra]))     # the envs' states, then the finals
    adder.set_q(q[:N], q[N:])
    ...                                        # act, step the envs
    adder.add(obs, actions, reward, next_obs, terminated, truncated, active)

and after the fragment's last step, ``set_q`` for the states the envs act
on next, then ``batch, priorities = adder.take(next_states)``.

Continuous actions (``action_shape=(d,)``, the DPG workers): the adder keeps two
values per step instead of a row of Q-values, ``[Q(s_t, a_t), V(s_t)]`` with
``V(s) = Q(s, mu(s))``, and ``|td| = |R + discount * V(s_{t+k}) - Q(s_t, a_t)|``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["VectorNStepAdder"]


class VectorNStepAdder:
    """n-step transitions of ``num_envs`` envs, a fragment at a time; see the module docstring."""

    def __init__(
        self,
        num_envs: int,
        n_step: int,
        gamma: float,
        obs_shape: tuple,
        obs_dtype: Any,
        fragment_length: int = 64,
        num_actions: int = 1,
        action_shape: tuple = (),
        action_dtype: Any = np.int64,
    ) -> None:
        if int(n_step) < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step!r}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
        n, m = int(n_step), int(num_envs)
        self.n_step, self.num_envs, self.gamma = n, m, float(gamma)
        self._act_shape, self._act_dtype = tuple(action_shape), action_dtype
        self.continuous = bool(self._act_shape)  # values [Q(s_t, a_t), V(s_t)] per step
        self.num_actions = 2 if self.continuous else int(num_actions)
        self._powers = np.array([self.gamma**i for i in range(n + 1)])
        self._shape, self._dtype = tuple(obs_shape), obs_dtype
        self._len = 0  # rows used: steps carried over, then this fragment's
        self._alloc(n - 1 + max(int(fragment_length), 1))
        self._none = np.zeros(0, np.int64)
        self._finals = self._none  # envs whose last step was a time limit's end

    def _alloc(self, rows: int) -> None:
        """(Re)allocate the rows; the rows used so far are kept."""
        m, a, shape, dtype = self.num_envs, self.num_actions, self._shape, self._dtype
        fresh = {
            "_obs": np.zeros((rows + 1, m, *shape), dtype),  # + the state after the last step
            "_next": np.zeros((rows, m, *shape), dtype),  # s_{t+1} where step t ended
            "_action": np.zeros((rows, m, *self._act_shape), self._act_dtype),
            "_reward": np.zeros((rows, m), np.float64),
            "_term": np.zeros((rows, m), bool),
            "_trunc": np.zeros((rows, m), bool),
            "_active": np.ones((rows, m), bool),  # True unless written otherwise
            "_start": np.ones((rows, m), bool),  # a step whose transition is still to come
            "_qs": np.zeros((rows + 1, m, a), np.float32),  # Q(s_t, .)
            "_final_q": np.zeros((rows, m, a), np.float32),  # Q of _next, at time limits
        }
        used = self._len + 1
        for name, arr in fresh.items():
            old = getattr(self, name, None)
            if old is not None:
                kept = old[:used]
                arr[: len(kept)] = kept
            setattr(self, name, arr)
        self._rows = rows

    @property
    def num_pending(self) -> int:
        """Steps of all envs whose transition is not emitted yet (< n_step each after a take)."""
        return int(self._start[: self._len].sum())

    def pending(self) -> np.ndarray:
        """Pending steps per env."""
        return self._start[: self._len].sum(axis=0)

    def pending_obs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(obs, actions)`` of every pending step (for new Q-values: :meth:`set_pending_q`)."""
        rows, env = np.nonzero(self._start[: self._len])
        return self._obs[rows, env], self._action[rows, env]

    def set_pending_q(self, q: np.ndarray) -> None:
        """Replace the kept Q-values (rows, actions) of the pending steps (in
        :meth:`pending_obs` order): new weights make new priorities for the steps
        still to complete."""
        rows, env = np.nonzero(self._start[: self._len])
        self._qs[rows, env] = q

    def finals(self) -> np.ndarray:
        """The envs whose last step was cut by a time limit (a final observation to value)."""
        return self._finals

    def final_obs(self) -> np.ndarray:
        """Those envs' final observations (rows to add to the next forward pass)."""
        return self._next[self._len - 1, self._finals]

    def set_q(self, q: np.ndarray, q_finals: np.ndarray | None = None) -> None:
        """Q-values (N, A) of the states the envs act on next, and (F, A) of :meth:`final_obs`."""
        self._qs[self._len] = q
        if len(self._finals):
            self._final_q[self._len - 1, self._finals] = q_finals

    def add(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        active: np.ndarray | None = None,
        any_end: bool = True,
    ) -> None:
        """Record one step of every env (arrays over the env axis).

        ``terminated`` ends the return with discount 0 (a training terminal: a lost
        life too); ``truncated`` ends it with discount gamma^k, bootstrapping from the
        final observation ``next_obs``. ``active`` (bool per env, default all): envs
        whose step is left out (an env error): their pending steps are dropped.
        ``any_end=False`` (a hint): no env's episode ended at this step.
        """
        if self._len == self._rows:
            self._alloc(2 * self._rows)
        t = self._len
        self._obs[t] = obs
        self._action[t] = action
        self._reward[t] = reward
        self._term[t] = terminated
        self._trunc[t] = truncated
        if active is not None:  # rows are all active unless written
            self._active[t] = self._start[t] = active
        if any_end:
            term = self._term[t]
            end = term | self._trunc[t]
            self._next[t, end] = next_obs[end]
            self._finals = np.flatnonzero(end & ~term & self._active[t])
        elif len(self._finals):
            self._finals = self._none
        self._len = t + 1

    def take(
        self, next_states: np.ndarray, keys: tuple[str, ...] | None = None
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The transitions completed since the last take and their float32 |td|.

        ``next_states``: what the envs act on next (s_{t+1} of the last step, unless it
        ended). The batch holds ``env, obs, action, reward, next_obs, done, discount,
        q_taken`` (or ``keys`` of them), env-major and oldest first within an env;
        call :meth:`set_q` for ``next_states`` first, for the priorities.
        """
        n, rows = self.n_step, self._len
        self._obs[rows] = next_states
        live = self._start[:rows].copy()  # starts still summing rewards
        ends = self._term[:rows] | self._trunc[:rows]
        ret = np.zeros(live.shape)
        k = np.zeros(live.shape, np.int64)  # steps summed, once complete
        ended = np.zeros(live.shape, bool)
        for m in range(n):  # step t + m of the transition from step t; t + m >= rows: pending
            head = live[: rows - m]
            if m:  # an env error before the transition completes: dropped
                head &= self._active[m:rows]
            if not head.any():
                break
            end = ends[m:rows]
            part = ret[: rows - m]  # oldest first, as the scalar adder sums
            part[head] = part[head] + self._powers[m] * self._reward[m:rows][head]
            stop = head & end if m < n - 1 else head.copy()
            k[: rows - m][stop] = m + 1
            ended[: rows - m] |= head & end
            head &= ~stop
        self._start[:rows] = live  # complete or dropped: no longer pending
        complete = k > 0
        env, step = np.nonzero(complete.T)  # env-major, oldest first
        kk = k[step, env]
        last = step + kk - 1
        is_end = ended[step, env]
        done = is_end & self._term[last, env]
        next_obs = self._obs[step + kk, env]
        if is_end.any():
            next_obs[is_end] = self._next[last[is_end], env[is_end]]
        action = self._action[step, env]
        boot = self._boot(self._qs[step + kk, env])
        if is_end.any():
            boot[is_end] = self._boot(self._final_q[last[is_end], env[is_end]])
        reward = ret[step, env].astype(np.float32)
        discount = np.where(done, 0.0, self._powers[kk]).astype(np.float32)
        q_taken = self._qs[step, env, 0 if self.continuous else action]
        target = reward + discount * np.where(done, np.float32(0.0), boot)
        priorities = np.abs(q_taken - target).astype(np.float32)
        batch = {
            "env": env,
            "obs": self._obs[step, env],
            "action": action,
            "reward": reward,
            "next_obs": next_obs,
            "done": done,
            "discount": discount,
            "q_taken": q_taken,
        }
        if keys is not None:
            batch = {key: batch[key] for key in keys}
        self._carry(rows)
        return batch, priorities

    def _boot(self, q: np.ndarray) -> np.ndarray:
        """Bootstrap values of rows of kept values: V(s) (continuous), else max_b Q(s, b)."""
        return q[:, 1].copy() if self.continuous else q.max(axis=1)

    def _carry(self, rows: int) -> None:
        """Move the last n - 1 steps (the only ones that can be pending) to the front."""
        keep = min(self.n_step - 1, rows)
        src = slice(rows - keep, rows)
        for name in ("_obs", "_next", "_action", "_reward", "_term", "_trunc", "_active"):
            arr = getattr(self, name)
            arr[:keep] = arr[src]
        self._start[:keep] = self._start[src]
        self._qs[:keep] = self._qs[src]
        self._obs[keep] = self._obs[rows]
        self._qs[keep] = self._qs[rows]
        self._final_q[:keep] = self._final_q[src]
        self._active[keep:rows] = self._start[keep:rows] = True
        self._finals = self._none
        self._len = keep
