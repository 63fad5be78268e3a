"""n-step transitions, built one env step at a time.

For a step t of an episode with rewards r_t, r_{t+1}, ... the adder emits

    R_{t:t+k} = sum_{j=0}^{k-1} gamma^j * r_{t+j}
    next_obs  = s_{t+k}
    discount  = 0                 if the episode *terminated* within the k steps
              = gamma^k           otherwise

with k = n once n steps past t were seen, so the learner's target is
``y_t = R_{t:t+k} + discount * Q_target(s_{t+k}, argmax_a Q_online(s_{t+k}, a))``.

Episode edges:

* **termination** (``terminated=True``): every pending step is flushed with
  k = the steps left to the end (k < n for the last n-1 steps), ``done=True``
  and ``discount=0``: the value after a terminal state is zero.
* **truncation** (``truncated=True``, a time limit): pending steps are flushed
  with k = steps left, ``done=False`` and ``discount=gamma^k``: the episode was
  cut, not ended, so the transitions still bootstrap from ``s_{t+k}`` (the
  final observation gymnasium returned, not the reset one).
* **episode shorter than n**: everything is flushed at its end with k < n.
* **rollout fragment boundary**: nothing happens. Pending steps stay in the
  adder and are completed by the next fragment's steps, so a fragment cut
  never shortens a return. Call :meth:`reset` only when the episode is
  abandoned without a terminal/truncation signal.

Each transition is a dict with keys ``obs, action, reward, next_obs, done,
discount``; :func:`stack_transitions` turns a list of them into a batch.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

__all__ = ["NStepAdder", "stack_transitions", "TRANSITION_KEYS"]

TRANSITION_KEYS: tuple[str, ...] = ("obs", "action", "reward", "next_obs", "done", "discount")
"""Keys of every transition and batch dict."""


class NStepAdder:
    """Turns a stream of env steps into n-step transitions (see the module docstring)."""

    def __init__(self, n_step: int, gamma: float) -> None:
        if int(n_step) < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step!r}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
        self.n_step = int(n_step)
        self.gamma = float(gamma)
        self._powers = [self.gamma**j for j in range(self.n_step + 1)]
        self._pending: deque[tuple[Any, int, float]] = deque()

    @property
    def num_pending(self) -> int:
        """Steps seen whose transition is not emitted yet (< n_step)."""
        return len(self._pending)

    def reset(self) -> None:
        """Drop pending steps without emitting them (an abandoned episode)."""
        self._pending.clear()

    def add(
        self,
        obs: Any,
        action: int,
        reward: float,
        next_obs: Any,
        terminated: bool,
        truncated: bool,
    ) -> list[dict[str, Any]]:
        """Record step (s_t, a_t, r_t, s_{t+1}); return the transitions it completes, oldest first."""
        pending = self._pending
        pending.append((obs, action, float(reward)))
        if terminated or truncated:
            out = self._flush(next_obs, bool(terminated))
            pending.clear()
            return out
        if len(pending) == self.n_step:
            out = [self._transition(0, next_obs, False)]
            pending.popleft()
            return out
        return []

    def _flush(self, next_obs: Any, terminated: bool) -> list[dict[str, Any]]:
        return [self._transition(j, next_obs, terminated) for j in range(len(self._pending))]

    def _transition(self, start: int, next_obs: Any, terminated: bool) -> dict[str, Any]:
        pending = self._pending
        k = len(pending) - start
        ret = 0.0
        for j in range(k):
            ret += self._powers[j] * pending[start + j][2]
        obs, action, _ = pending[start]
        return {
            "obs": obs,
            "action": action,
            "reward": ret,
            "next_obs": next_obs,
            "done": terminated,
            "discount": 0.0 if terminated else self._powers[k],
        }


def stack_transitions(
    transitions: list[dict[str, Any]],
    obs_shape: tuple[int, ...] | None = None,
    obs_dtype: Any = None,
) -> dict[str, np.ndarray]:
    """Stack transition dicts into a batch of arrays.

    dtypes: ``obs``/``next_obs`` keep the observations' dtype (or ``obs_dtype``),
    ``action`` int64, ``reward`` float32, ``done`` bool, ``discount`` float32.
    An empty list needs ``obs_shape`` and ``obs_dtype`` to shape the empty batch.
    """
    if not transitions:
        if obs_shape is None or obs_dtype is None:
            raise ValueError("stacking zero transitions needs obs_shape and obs_dtype")
        empty_obs = np.zeros((0, *obs_shape), dtype=obs_dtype)
        return {
            "obs": empty_obs,
            "action": np.zeros(0, dtype=np.int64),
            "reward": np.zeros(0, dtype=np.float32),
            "next_obs": empty_obs.copy(),
            "done": np.zeros(0, dtype=bool),
            "discount": np.zeros(0, dtype=np.float32),
        }
    return {
        "obs": np.asarray([t["obs"] for t in transitions], dtype=obs_dtype),
        "action": np.asarray([t["action"] for t in transitions], dtype=np.int64),
        "reward": np.asarray([t["reward"] for t in transitions], dtype=np.float32),
        "next_obs": np.asarray([t["next_obs"] for t in transitions], dtype=obs_dtype),
        "done": np.asarray([t["done"] for t in transitions], dtype=bool),
        "discount": np.asarray([t["discount"] for t in transitions], dtype=np.float32),
    }
