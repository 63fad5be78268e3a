"""Exploration noise for deterministic-policy (DPG) env workers, one scale per worker.

The continuous analogue of the epsilon ladder (:mod:`apex_dask.algo.rollout.exploration`):
env worker i of N adds noise of scale

    sigma_i = base ** (1 + alpha * i / (N - 1)),   i = 0 .. N-1

(a geometric ladder from ``base`` down to ``base ** (1 + alpha)``; one worker: ``base``),
so worker 0 explores most and metrics follow the lowest-noise third (the highest
indices, :func:`~apex_dask.algo.rollout.exploration.lowest_epsilon_workers`). Scales are in
units of the action's half range: an action is

    a = clip(mu(s) + sigma_i * x * (high - low) / 2, low, high)

with ``x`` one of

* ``gaussian``: x ~ N(0, I), drawn afresh each step;
* ``ou`` (Ornstein-Uhlenbeck, as RLlib's ``PerWorkerOrnsteinUhlenbeckNoise``):
  x_{t+1} = (1 - theta) x_t + sqrt(1 - (1 - theta)^2) * N(0, I), x = 0 at an
  episode's start. The step's scale makes the stationary standard deviation 1,
  so ``sigma_i`` means the same in both.

Each env of a worker has its own noise row; draws come from the worker's own
``numpy.random.Generator``.
"""

from __future__ import annotations

import math

import numpy as np

from apex_dask.algo.rollout.exploration import apex_epsilons

__all__ = ["NOISE_TYPES", "ActionNoise", "noise_ladder"]

NOISE_TYPES = ("gaussian", "ou")


def noise_ladder(num_workers: int, base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """Per-worker noise scales ``base ** (1 + alpha * i / (N - 1))`` (see the module docstring)."""
    return apex_epsilons(num_workers, base, alpha)


class ActionNoise:
    """Noise rows ``(num_envs, action_dim)`` of one worker: ``sample()`` per step,
    ``reset(mask)`` where episodes ended (OU state back to 0)."""

    def __init__(
        self,
        kind: str,
        sigma: float,
        shape: tuple[int, int],
        rng: np.random.Generator,
        theta: float = 0.15,
    ) -> None:
        if kind not in NOISE_TYPES:
            raise ValueError(f"noise must be one of {NOISE_TYPES}, got {kind!r}")
        if not sigma >= 0.0:
            raise ValueError(f"sigma must be >= 0, got {sigma!r}")
        if not 0.0 < theta <= 1.0:
            raise ValueError(f"theta must be in (0, 1], got {theta!r}")
        self.kind, self.sigma, self.theta = kind, float(sigma), float(theta)
        self.shape, self.rng = tuple(shape), rng
        self.state = np.zeros(self.shape)
        self._step = math.sqrt(1.0 - (1.0 - self.theta) ** 2)

    def sample(self) -> np.ndarray:
        """The next noise rows, already multiplied by ``sigma`` (float64)."""
        if self.sigma == 0.0:
            return np.zeros(self.shape)
        draw = self.rng.standard_normal(self.shape)
        if self.kind == "gaussian":
            return self.sigma * draw
        self.state = (1.0 - self.theta) * self.state + self._step * draw
        return self.sigma * self.state

    def reset(self, mask: np.ndarray) -> None:
        """Start the OU process again for the envs in ``mask`` (bool per env)."""
        self.state[np.asarray(mask, bool)] = 0.0
