"""Sum-tree and min-tree over a fixed number of slots, for prioritized replay.

Layout: a complete ``k``-ary tree (``k = FANOUT = 8``) stored level by
level in flat ``float64`` arrays. Level ``D`` holds one leaf per slot; node
``i`` of level ``d`` has the children ``k*i .. k*i + k - 1`` of level
``d + 1``, which sit next to each other in memory (8 float64 = one 64-byte
cache line), so a query or an update touches one line per level: 7 levels
for 2^20 slots instead of 20 in a binary tree. For every internal node

    sum = ((0 + c_0) + c_1) + ... + c_{k-1}      (added in this order)
    min = min(c_0, ..., c_{k-1})

Empty slots hold mass 0 in the sum-tree and ``+inf`` in the min-tree, so the
sum-tree's root is the total mass and the min-tree's root the smallest mass of
the filled slots.

Internal nodes are always *recomputed from their children*, in the fixed
order above, never adjusted by a delta: after any sequence of updates every
node equals (bit for bit) what :meth:`SumMinTree.rebuild` computes. No drift.
Writes of consecutive slots (``set_range``/``fill_range``, as a ring buffer
adds) only write leaves and widen a pending range; the next reading call
(:meth:`SumMinTree.flush`) recomputes their ancestors once.

Sampling descends from the root: among a node's 8 children, three binary
steps on pair sums (``(c0+c1)+(c2+c3)`` against the rest, then a pair, then
one child) choose where the target mass falls. A step goes right only when
the right part holds mass, so rounding at an edge never selects an empty
slot.

Two backends compute the same values (:mod:`apex_dask.algo.replay.sumtree_kernels`):
numba kernels (the default when numba imports; compiled eagerly with explicit
signatures and cached on disk) and a vectorized numpy fallback. Both walk all
queries one level at a time. Tree nodes and sampled slots agree exactly;
weights to float32 rounding.
"""

from __future__ import annotations

import numpy as np

from apex_dask.algo.replay.sumtree_kernels import (
    FANOUT,
    HAVE_NUMBA,
    _np_fix,
    _np_nodes,
    _np_sample,
    _np_set,
)

if HAVE_NUMBA:
    from apex_dask.algo.replay.sumtree_kernels import _nb_fix, _nb_sample, _nb_set

__all__ = ["HAVE_NUMBA", "SumMinTree"]


# --------------------------------------------------------------------------
class SumMinTree:
    """Sum-tree and min-tree of masses ``m_s >= 0`` over ``capacity`` slots.

    ``sample(u, beta)`` maps uniforms ``u_q`` in [0, 1) to slots: slot ``s`` is
    returned when ``u_q * M`` falls in ``[c_s, c_s + m_s)``, with ``M`` the
    total mass and ``c_s`` the mass of the slots before ``s``. With iid
    uniforms each query draws slot ``s`` with probability ``m_s / M``; slots of
    mass 0 are never returned. Each query also gets the importance weight
    ``(m_s / m_min) ** -beta`` (``m_min``: smallest mass of the filled slots),
    which equals ``(N P(s)) ** -beta / max_j (N P(j)) ** -beta``.

    Usage::

        tree = SumMinTree(1000)
        tree.set(np.array([0, 1, 2]), np.array([1.0, 2.0, 0.5]))
        tree.fill_range(3, 2, 4.0)                         # slots 3 and 4
        slots, weights = tree.sample(rng.random(32), beta=0.4)

    ``backend`` is ``"numba"``, ``"numpy"`` or ``"auto"`` (numba if present).
    The arrays ``sum_tree`` and ``min_tree`` (level by level, root first) are
    consistent after :meth:`flush`; every method that reads them flushes.
    """

    def __init__(self, capacity: int, backend: str = "auto") -> None:
        capacity = int(capacity)
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if backend == "auto":
            backend = "numba" if HAVE_NUMBA else "numpy"
        if backend not in ("numba", "numpy"):
            raise ValueError(f"backend must be 'auto', 'numba' or 'numpy', got {backend!r}")
        if backend == "numba" and not HAVE_NUMBA:
            raise ImportError("backend='numba' needs numba, which is not importable")
        self.capacity = capacity
        self.backend = backend
        k = FANOUT
        # counts[d]: nodes of level d that can hold mass; level d + 1 gets k * counts[d] places.
        counts = [capacity]
        while counts[-1] > 1:
            counts.append(-(-counts[-1] // k))
        counts.reverse()
        sizes = [1] + [k * c for c in counts[:-1]]
        offs = np.zeros(len(sizes), np.int64)
        for d in range(1, len(sizes)):
            offs[d] = offs[d - 1] + -(-sizes[d - 1] // 8) * 8  # each level starts on 64 bytes
        self.depth = len(sizes) - 1
        self.offsets = offs
        self.counts = np.array(counts, np.int64)
        n_nodes = int(offs[-1]) + sizes[-1]
        self.sum_tree = _aligned(n_nodes, 0.0)
        self.min_tree = _aligned(n_nodes, np.inf)
        self._leaf0 = int(offs[-1])
        self._sum_leaves = self.sum_tree[self._leaf0 : self._leaf0 + capacity]
        self._min_leaves = self.min_tree[self._leaf0 : self._leaf0 + capacity]
        self._dirty_lo = self._dirty_hi = 0  # leaves [lo, hi) whose ancestors are stale
        self._args = (self.sum_tree, self.min_tree, self.offsets, self.counts)

    def __getstate__(self) -> dict:
        # Pickle the two trees only; the leaf views and kernel arguments are
        # rebuilt on load (pickled views would come back as detached copies).
        self.flush()
        return {
            "capacity": self.capacity,
            "backend": self.backend,
            "sum": self.sum_tree,
            "min": self.min_tree,
        }

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["capacity"], state["backend"])
        self.sum_tree[:] = state["sum"]
        self.min_tree[:] = state["min"]

    @property
    def total(self) -> float:
        """Total mass ``M``: the sum-tree's root."""
        self.flush()
        return float(self.sum_tree[0])

    @property
    def min(self) -> float:
        """Smallest mass of the filled slots (``inf`` when none): the min-tree's root."""
        self.flush()
        return float(self.min_tree[0])

    def masses(self, slots: np.ndarray | None = None) -> np.ndarray:
        """Leaf masses of ``slots`` (all ``capacity`` slots when None), a copy."""
        return self._sum_leaves.copy() if slots is None else self._sum_leaves[slots]

    def set(self, slots: np.ndarray, masses: np.ndarray) -> None:
        """Set ``m[slots[j]] = masses[j]``; with repeated slots the last value wins.

        The caller guarantees ``0 <= slots < capacity`` and finite masses >= 0.
        """
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        masses = np.ascontiguousarray(masses, dtype=np.float64)
        if slots.shape[0] == 0:
            return
        self.flush()
        if self.backend == "numba":
            _nb_set(*self._args, slots, masses)
        else:
            _np_set(self.sum_tree, self.min_tree, self.offsets, slots, masses)

    def set_range(self, start: int, masses: np.ndarray) -> None:
        """Set the slots ``start .. start + len(masses) - 1`` (no wrap-around) to ``masses``.

        Writes only the leaves; their ancestors are recomputed by the next
        :meth:`flush` (which every reading method calls), so that consecutive
        ranges, as a ring buffer writes them, share one pass up the tree.
        """
        n = len(masses)
        if n:
            self._check_range(start, n)
            self._sum_leaves[start : start + n] = masses
            self._min_leaves[start : start + n] = masses
            self._mark(start, start + n)

    def fill_range(self, start: int, count: int, mass: float) -> None:
        """Set the slots ``start .. start + count - 1`` (no wrap-around) to one ``mass``.

        Deferred like :meth:`set_range`.
        """
        if count > 0:
            self._check_range(start, count)
            self._sum_leaves[start : start + count] = mass
            self._min_leaves[start : start + count] = mass
            self._mark(start, start + count)

    def clear_range(self, start: int, count: int) -> None:
        """Empty the slots ``start .. start + count - 1`` (no wrap-around): mass 0,
        left out of the minimum. Deferred like :meth:`set_range`."""
        if count > 0:
            self._check_range(start, count)
            self._sum_leaves[start : start + count] = 0.0
            self._min_leaves[start : start + count] = np.inf
            self._mark(start, start + count)

    @property
    def nbytes(self) -> int:
        """Bytes of the two tree arrays (with their alignment padding)."""
        return int(self.sum_tree.base.nbytes + self.min_tree.base.nbytes)

    def _check_range(self, start: int, n: int) -> None:
        if start < 0 or start + n > self.capacity:
            raise ValueError(f"slots [{start}, {start + n}) outside [0, {self.capacity})")

    def _mark(self, lo: int, hi: int) -> None:
        if self._dirty_hi > self._dirty_lo:  # something pending
            if lo <= self._dirty_hi and hi >= self._dirty_lo:  # touches it: merge
                self._dirty_lo = min(lo, self._dirty_lo)
                self._dirty_hi = max(hi, self._dirty_hi)
                return
            self.flush()
        self._dirty_lo, self._dirty_hi = lo, hi

    def flush(self) -> None:
        """Recompute the ancestors of leaves written by ``set_range``/``fill_range``."""
        lo, hi = self._dirty_lo, self._dirty_hi
        if hi > lo:
            self._dirty_lo = self._dirty_hi = 0
            if self.backend == "numba":
                _nb_fix(*self._args, lo, hi - 1)
            else:
                _np_fix(self.sum_tree, self.min_tree, self.offsets, lo, hi - 1)

    def sample(self, u: np.ndarray, beta: float) -> tuple[np.ndarray, np.ndarray]:
        """Slots (int64) and importance weights (float32) for uniforms ``u`` in [0, 1).

        Needs a positive total mass.
        """
        u = np.array(u, dtype=np.float64)  # a private copy: the kernel works in it
        self.flush()
        if self.backend == "numba":
            slots = np.empty(u.shape[0], np.int64)
            weights = np.empty(u.shape[0], np.float32)
            _nb_sample(*self._args, u, float(beta), slots, weights)
            return slots, weights
        return _np_sample(self.sum_tree, self.min_tree, self.offsets, u, float(beta))

    def load_masses(self, masses: np.ndarray) -> None:
        """Replace all leaves: slot ``s`` gets ``masses[s]``; later slots are emptied."""
        masses = np.asarray(masses, dtype=np.float64)
        if masses.shape[0] > self.capacity:
            raise ValueError(f"{masses.shape[0]} masses for a tree of capacity {self.capacity}")
        self.sum_tree[self._leaf0 :] = 0.0
        self.min_tree[self._leaf0 :] = np.inf
        self.sum_tree[self._leaf0 : self._leaf0 + masses.shape[0]] = masses
        self.min_tree[self._leaf0 : self._leaf0 + masses.shape[0]] = masses
        self.rebuild()

    def rebuild(self) -> None:
        """Recompute every internal node from its children, level by level."""
        self._dirty_lo = self._dirty_hi = 0
        for d in range(self.depth - 1, -1, -1):
            nodes = np.arange(self.counts[d])
            _np_nodes(self.sum_tree, self.min_tree, self.offsets, d, nodes)


def _aligned(n: int, fill: float) -> np.ndarray:
    """A float64 array of ``n`` items filled with ``fill``, starting on a 64-byte boundary."""
    buf = np.empty(n + 8, np.float64)
    shift = (-buf.ctypes.data % 64) // 8
    out = buf[shift : shift + n]
    out.fill(fill)
    return out
