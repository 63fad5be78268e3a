"""The priorities of a replay shard's slots, their masses in a sum/min tree, and sampling.

Pure numpy (+ the numba tree kernels). The items live in
:mod:`apex_dask.algo.replay.storage`; :class:`~apex_dask.algo.replay.shard.ReplayShard`
composes both.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from apex_dask.algo.replay.sumtree import SumMinTree

__all__ = ["Priorities"]


class Priorities:
    """Priorities ``p_i >= 0`` of ``capacity`` slots, their masses and the largest seen.

    Owns: the priority of every slot, the masses ``m_i = (p_i + eps) ** alpha``
    in a :class:`~apex_dask.algo.replay.sumtree.SumMinTree` (``tree``), the largest
    priority seen (1.0 before any was given: what a slot written without a
    priority gets), and their checkpoint keys ``priority``, ``mass`` (one per
    slot ever written) and ``max_priority``. An empty slot has priority 0 and
    is never drawn.

    Usage (by :class:`~apex_dask.algo.replay.shard.ReplayShard`)::

        prios = Priorities(capacity, alpha=0.6, eps=1e-6)
        p, top = prios.check(priorities, n, "add")   # ValueError for bad ones
        prios.set_range(start, p, n)                 # p None: the max priority seen
        prios.raise_max(top)
        slots, weights = prios.sample(rng.random(512), beta=0.4)
    """

    def __init__(self, capacity: int, alpha: float, eps: float, *, backend: str = "auto") -> None:
        self.capacity = int(capacity)
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.tree = SumMinTree(self.capacity, backend=backend)
        self._priority = np.zeros(self.capacity, np.float64)
        self._max_priority = 1.0
        self._max_mass = self.mass(np.ones(1))[0]

    @property
    def max_priority(self) -> float:
        """Largest priority seen so far (1.0 before any was given)."""
        return self._max_priority

    @property
    def total(self) -> float:
        """The total mass of all slots."""
        return self.tree.total

    @property
    def nbytes(self) -> int:
        """Bytes of the priorities and the trees."""
        return int(self._priority.nbytes + self.tree.nbytes)

    def mass(self, priorities: np.ndarray) -> np.ndarray:
        """``(p + eps) ** alpha``."""
        return np.power(priorities + self.eps, self.alpha)

    @staticmethod
    def check(priorities: object, n: int, what: str) -> tuple[np.ndarray, float]:
        """The priorities as float64 [n] and their maximum, or ``ValueError``."""
        p = np.asarray(priorities, dtype=np.float64)
        if p.shape != (n,):
            raise ValueError(f"{what}: expected {n} priorities, got shape {p.shape}")
        if n == 0:
            return p, 0.0
        top = p.max()
        # NaN fails both comparisons; +-inf fails one of them.
        if not (p.min() >= 0.0 and top < np.inf):
            raise ValueError(f"{what}: priorities must be finite and >= 0")
        return p, float(top)

    # ---------------------------------------------------------------- writing
    def set_range(self, start: int, p: np.ndarray | None, count: int) -> None:
        """Priorities of ``count`` slots from ``start``: ``p``, or the max priority seen."""
        if p is None:
            self.tree.fill_range(start, count, self._max_mass)
            self._priority[start : start + count] = self._max_priority
        else:
            self.tree.set_range(start, self.mass(p))
            self._priority[start : start + count] = p

    def set(self, slots: np.ndarray, p: np.ndarray) -> None:
        """``p_slots[k] = p[k]`` (int64 slots; the last one wins for repeated slots)."""
        self._priority[slots] = p  # repeated slots: numpy assigns in order, the last stays
        self.tree.set(slots, self.mass(p))

    def clear(self, start: int, count: int) -> None:
        """Empty ``count`` slots from ``start`` (wrapping): never sampled again."""
        n1 = min(count, self.capacity - start)
        for a, c in ((start, n1), (0, count - n1)):
            self.tree.clear_range(a, c)
            self._priority[a : a + c] = 0.0

    def raise_max(self, top: float) -> None:
        """Make ``top`` the max priority seen if it is larger."""
        if top > self._max_priority:
            self._max_priority = top
            self._max_mass = self.mass(np.array([top]))[0]

    # ---------------------------------------------------------------- reading
    def sample(self, u: np.ndarray, beta: float) -> tuple[np.ndarray, np.ndarray]:
        """Slots and importance weights for uniforms ``u`` (:meth:`SumMinTree.sample`)."""
        return self.tree.sample(u, beta)

    # ------------------------------------------------------------- checkpoint
    def state_dict(self, filled: int) -> dict[str, np.ndarray | float]:
        """``priority``, ``mass`` (float64 [filled]: slots ``0..filled-1``) and ``max_priority``."""
        return {
            "max_priority": self._max_priority,
            "priority": self._priority[:filled].copy(),
            "mass": self.tree.masses(np.arange(filled)),
        }

    def state_dict_at(self, slots: np.ndarray) -> dict[str, np.ndarray | float]:
        """:meth:`state_dict` of a shard holding only the items of ``slots``, moved to
        slots ``0 .. len(slots) - 1`` in that order."""
        return {
            "max_priority": self._max_priority,
            "priority": self._priority[slots],
            "mass": self.tree.masses(slots),
        }

    def load_state_dict(self, state: Mapping[str, object], filled: int) -> None:
        """Restore :meth:`state_dict` (``ValueError`` when its arrays do not have ``filled``
        items; nothing changed then). Slots from ``filled`` on are empty."""
        priority = np.asarray(state["priority"], dtype=np.float64)
        mass = np.asarray(state["mass"], dtype=np.float64)
        if priority.shape != (filled,) or mass.shape != (filled,):
            raise ValueError(f"state priority/mass arrays do not have {filled} items")
        max_priority = float(np.asarray(state["max_priority"]).item())
        self._priority[:] = 0.0
        self._priority[:filled] = priority
        self.tree.load_masses(mass)
        self._max_priority = max_priority
        self._max_mass = self.mass(np.array([max_priority]))[0]
