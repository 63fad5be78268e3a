"""Ape-X per-worker exploration: a fixed epsilon for each env worker.

Worker i of N (0-based) explores with

    eps_i = base ** (1 + alpha * i / (N - 1)),   i = 0 .. N-1,

so worker 0 uses ``base`` (0.4 by default, the most exploratory) and worker
N-1 uses ``base ** (1 + alpha)`` (0.4 ** 8 ~ 6.6e-4). With one worker it
uses ``base``. Metrics follow the least-exploring third (highest indices).

When fewer workers than the ladder's N run (an elastic run that grows up to
N), the slots are taken in :func:`ladder_fill_order`: the two ends first, then
always the slot farthest from those taken, so any count spans the ladder from
``base`` to ``base ** (1 + alpha)`` (2 of N slots are exactly the 2-worker ladder).
The same ladder gives the DPG agent's noise scales. An agent's worker makes
the exploring choice itself (the DQN agent: one draw per env, one forward for
the greedy ones).
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = ["apex_epsilons", "ladder_fill_order", "lowest_epsilon_workers"]


def apex_epsilons(num_workers: int, base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """Epsilons ``eps_i = base ** (1 + alpha * i / (N - 1))`` for i = 0..N-1 (float64).

    ``N = 1`` gives ``[base]``. Raises ``ValueError`` if ``num_workers`` is not an
    integer >= 1, ``base`` is outside (0, 1] or ``alpha`` is negative.
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, numbers.Integral):
        raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}")
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if not 0.0 < base <= 1.0:
        raise ValueError(f"base must be in (0, 1], got {base!r}")
    if not alpha >= 0.0:
        raise ValueError(f"alpha must be >= 0, got {alpha!r}")
    n = int(num_workers)
    if n == 1:
        return np.array([base], dtype=np.float64)
    i = np.arange(n, dtype=np.float64)
    return base ** (1.0 + alpha * i / (n - 1))


def lowest_epsilon_workers(num_workers: int) -> list[int]:
    """Indices of the third of workers with the lowest epsilons (the highest indices).

    As RLlib's Ape-X, which reports from ``workers[-N // 3:]``: the last
    ``ceil(N / 3)`` workers (11 of 32, 1 of 2, 1 of 1).
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    k = -(-num_workers // 3)
    return list(range(num_workers - k, num_workers))


def ladder_fill_order(num_slots: int) -> list[int]:
    """The order in which a ladder of ``num_slots`` epsilons is filled: 0, N-1, then
    repeatedly the slot whose distance to the nearest taken one is largest (the lowest
    such index on a tie). ``N = 5``: ``[0, 4, 2, 1, 3]``; ``N = 4``: ``[0, 3, 1, 2]``."""
    n = int(num_slots)
    if n < 1:
        raise ValueError(f"num_slots must be >= 1, got {num_slots}")
    order = [0] + ([n - 1] if n > 1 else [])
    gap = [min(i, n - 1 - i) for i in range(n)]  # distance to the nearest taken slot
    for i in order:
        gap[i] = -1
    while len(order) < n:
        nxt = max(range(n), key=lambda i: (gap[i], -i))
        order.append(nxt)
        gap = [-1 if g < 0 else min(g, abs(i - nxt)) for i, g in enumerate(gap)]
    return order
