"""One prioritized replay shard: a ring of transitions plus a sum/min tree.

Pure numpy (+ numba kernels in :mod:`apex_dask.algo.sumtree`); no Dask here.
The runtime wraps it in an actor; the in-process runner uses it directly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from apex_dask.algo.sumtree import SumMinTree

__all__ = ["REQUIRED_KEYS", "ReplayShard", "ReplaySample"]

REQUIRED_KEYS: tuple[str, ...] = ("obs", "action", "reward", "next_obs", "done")
_COUNTERS = ("added", "sampled", "updated")
_TIMERS = ("add_s", "sample_s", "update_s")
_MASK64 = (1 << 64) - 1
_PACK_BYTES = 128  # keys up to this many bytes per item are stored in one record array


@dataclass(frozen=True)
class ReplaySample:
    """A sampled batch: ``data[k][j]`` is the item stored at slot ``indices[j]``.

    ``weights[j]`` is its importance weight; hand ``indices`` back to
    :meth:`ReplayShard.update_priorities` with the new priorities.
    """

    indices: np.ndarray  # int64 [B]
    weights: np.ndarray  # float32 [B]
    data: dict[str, np.ndarray]


class ReplayShard:
    """Prioritized replay over a ring of ``capacity`` slots.

    Each stored item ``i`` has a priority ``p_i >= 0`` (an |TD error|) and the
    mass ``m_i = (p_i + eps) ** alpha``. Sampling draws ``batch_size`` items
    iid, with replacement, each with probability

        P(i) = (p_i + eps) ** alpha / sum_k (p_k + eps) ** alpha

    (one uniform per query, descended through a sum-tree). Item ``i`` gets the
    importance weight

        w_i = (N * P(i)) ** -beta / max_j (N * P(j)) ** -beta
            = (m_i / min_j m_j) ** -beta

    where ``N = len(self)`` and ``j`` runs over all stored items; the minimum
    mass comes from a min-tree (with ``eps = 0`` and a zero priority stored,
    ``min_j m_j = 0`` and every weight is 0). Items added without priorities
    get the largest priority seen so far (1.0 before any was given);
    ``update_priorities`` raises that maximum too.

    Sampling uses plain iid uniforms, not RLlib's stratified segments: draws
    are then independent, exactly "with replacement", and the law above holds
    per draw. Masses live in float64 sum/min trees
    (:class:`~apex_dask.algo.sumtree.SumMinTree`) whose nodes are recomputed
    from their children, so they never drift from their leaves.

    The schema (keys, dtypes, per-item shapes) is fixed by the first ``add``;
    ``obs, action, reward, next_obs, done`` are required, extra keys (e.g.
    ``discount``) are stored too. Keys of at most 128 bytes per item share
    one record array (one sampled item costs a cache line or two, not one per
    key); larger keys, such as image observations, get their own array. When
    the ring is full the oldest items are overwritten. Indices are slots: an
    index refers to whatever item sits in that slot now.

    Usage::

        shard = ReplayShard(2**20, alpha=0.6, seed=0)
        shard.add(rollout, priorities=initial_td)         # rollout: dict of arrays
        s = shard.sample(512, beta=0.4)                    # s.indices, s.weights, s.data
        shard.update_priorities(s.indices, np.abs(td_error))

    ``backend`` picks the tree kernels: ``"numba"``, ``"numpy"`` or ``"auto"``.
    """

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        eps: float = 1e-6,
        seed: int | None = None,
        *,
        backend: str = "auto",
    ) -> None:
        capacity = int(capacity)
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if not (np.isfinite(alpha) and alpha >= 0.0):
            raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
        if not (np.isfinite(eps) and eps >= 0.0):
            raise ValueError(f"eps must be finite and >= 0, got {eps}")
        self.capacity = capacity
        self.alpha = float(alpha)
        self.eps = float(eps)
        self._tree = SumMinTree(capacity, backend=backend)
        self._rng = np.random.default_rng(seed)
        self._priority = np.zeros(capacity, np.float64)
        self._storage: dict[str, np.ndarray] | None = None  # per key, [capacity, *shape]
        self._records: np.ndarray | None = None  # small keys' fields, one record per slot
        self._packed: tuple[str, ...] = ()
        self._schema: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        self._keys: frozenset[str] = frozenset()
        self._size = 0
        self._pos = 0
        self._max_priority = 1.0
        self._max_mass = self._mass(np.ones(1))[0]
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._times = dict.fromkeys(_TIMERS, 0.0)

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return self._size

    def __reduce__(self) -> tuple:
        # Pickle through state_dict: compact (stored items only), and the
        # per-key views into the record array are rebuilt, not copied apart.
        args = (self.capacity, self.alpha, self.eps, None)
        return (_restore, (args, self.backend, self.state_dict()))

    @property
    def backend(self) -> str:
        """The tree backend in use: ``"numba"`` or ``"numpy"``."""
        return self._tree.backend

    @property
    def max_priority(self) -> float:
        """Largest priority seen so far (1.0 before any was given)."""
        return self._max_priority

    def _mass(self, priorities: np.ndarray) -> np.ndarray:
        return np.power(priorities + self.eps, self.alpha)

    @staticmethod
    def _check_priorities(priorities: object, n: int, what: str) -> tuple[np.ndarray, float]:
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

    # --------------------------------------------------------------------- add
    def _set_schema(self, batch: Mapping[str, np.ndarray]) -> None:
        missing = [k for k in REQUIRED_KEYS if k not in batch]
        if missing:
            raise ValueError(f"batch lacks required key(s) {missing}; it has {sorted(batch)}")
        arrays = {k: np.asarray(v) for k, v in batch.items()}
        for k, a in arrays.items():
            if a.ndim == 0:
                raise ValueError(f"batch[{k!r}] must have a first (batch) dimension")
        self._schema = {k: (a.dtype, a.shape[1:]) for k, a in arrays.items()}
        self._keys = frozenset(arrays)

    def _allocate(self) -> None:
        # Keys of at most _PACK_BYTES per item share one record array, so that a
        # sampled item costs one or two cache lines instead of one per key;
        # larger keys (images) get an array of their own.
        small = [
            (k, dtype, shape)
            for k, (dtype, shape) in self._schema.items()
            if dtype.itemsize * math.prod(shape) <= _PACK_BYTES and not dtype.hasobject
        ]
        self._records = np.empty(self.capacity, np.dtype(small, align=True)) if small else None
        self._packed = tuple(k for k, _, _ in small)
        self._storage = {
            k: self._records[k] if k in self._packed else np.empty((self.capacity, *shape), dtype)
            for k, (dtype, shape) in self._schema.items()
        }

    def _check_batch(self, batch: Mapping[str, np.ndarray]) -> tuple[int, Mapping[str, np.ndarray]]:
        """Number of items in ``batch`` and its arrays, or ``ValueError`` naming a bad key."""
        if batch.keys() != self._keys:
            extra = sorted(set(batch) - self._keys)
            missing = sorted(self._keys - set(batch))
            key = (missing or extra)[0]
            raise ValueError(
                f"batch key {key!r} does not match the schema (missing {missing}, extra {extra})"
            )
        schema = self._schema
        n = -1
        converted = None
        for k, a in batch.items():
            if type(a) is not np.ndarray:
                a = np.asarray(a)
                converted = {} if converted is None else converted
                converted[k] = a
            dtype, shape = schema[k]
            if a.dtype != dtype or a.shape[1:] != shape or a.ndim == 0:
                raise ValueError(
                    f"batch[{k!r}] is {a.dtype}{list(a.shape[1:])} per item, "
                    f"the schema says {dtype}{list(shape)}"
                )
            if a.shape[0] != n:
                if n >= 0:
                    raise ValueError(f"batch[{k!r}] has {a.shape[0]} items, other keys have {n}")
                n = a.shape[0]
        if converted is not None:
            return n, {**batch, **converted}
        return n, batch

    def add(
        self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None
    ) -> np.ndarray:
        """Store the ``n`` items of ``batch`` (dict of arrays, equal first dims).

        Item ``k`` goes to slot ``(pos + k) % capacity`` with priority
        ``priorities[k]``, or the largest priority seen so far when None.
        Returns those slots (int64 [n]). If ``n > capacity`` only the last
        ``capacity`` items remain stored.
        """
        t0 = time.perf_counter()
        first = self._storage is None
        if first:
            self._set_schema(batch)
        try:
            n, arrays = self._check_batch(batch)
            if priorities is None:
                p = None
            else:
                p, top = self._check_priorities(priorities, n, "add")
        except ValueError:
            if first:  # a rejected first batch fixes no schema
                self._schema, self._keys = {}, frozenset()
            raise
        if first:
            self._allocate()
        cap, pos = self.capacity, self._pos
        end = pos + n
        slots = np.arange(pos, end, dtype=np.int64)
        if end <= cap:  # the common case: one slice per key
            for k, a in arrays.items():
                self._storage[k][pos:end] = a
            self._set_priorities_range(pos, p, n)
        else:
            slots %= cap
            self._add_wrapping(arrays, p, n)
        if p is not None:
            self._raise_max(top)
        self._pos = end % cap
        self._size = min(cap, self._size + n)
        self._counts["added"] += n
        self._times["add_s"] += time.perf_counter() - t0
        return slots

    def _add_wrapping(self, arrays: Mapping[str, np.ndarray], p: np.ndarray | None, n: int) -> None:
        # Only the last `cap` items survive; write them as two slices: [start, cap) and [0, n2).
        cap = self.capacity
        skip = max(0, n - cap)
        start = (self._pos + skip) % cap
        n1 = min(n - skip, cap - start)
        for k, a in arrays.items():
            dst = self._storage[k]
            dst[start : start + n1] = a[skip : skip + n1]
            dst[: n - skip - n1] = a[skip + n1 :]
        if p is None:
            self._set_priorities_range(start, None, n1)
            self._set_priorities_range(0, None, n - skip - n1)
        else:
            self._set_priorities_range(start, p[skip : skip + n1])
            self._set_priorities_range(0, p[skip + n1 :])

    def _set_priorities_range(self, start: int, p: np.ndarray | None, count: int = -1) -> None:
        """Priorities of the slots from ``start``: ``p``, or the max priority for ``count``."""
        if p is None:
            self._tree.fill_range(start, count, self._max_mass)
            self._priority[start : start + count] = self._max_priority
        else:
            self._tree.set_range(start, self._mass(p))
            self._priority[start : start + p.shape[0]] = p

    def _raise_max(self, top: float) -> None:
        if top > self._max_priority:
            self._max_priority = top
            self._max_mass = self._mass(np.array([top]))[0]

    # ------------------------------------------------------------------ sample
    def sample(self, batch_size: int, beta: float) -> ReplaySample:
        """Draw ``batch_size`` items iid with probability ``P(i)``; weights ``w_i`` (see class)."""
        t0 = time.perf_counter()
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay shard")
        batch_size = int(batch_size)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not (np.isfinite(beta) and beta >= 0.0):
            raise ValueError(f"beta must be finite and >= 0, got {beta}")
        if not self._tree.total > 0.0:
            raise ValueError(
                "all stored items have mass 0 (priority 0 with eps=0): nothing to sample"
            )
        indices, weights = self._tree.sample(self._rng.random(batch_size), beta)
        records = None if self._records is None else self._records.take(indices)
        data = {
            k: np.ascontiguousarray(records[k]) if k in self._packed else v.take(indices, axis=0)
            for k, v in self._storage.items()
        }
        self._counts["sampled"] += batch_size
        self._times["sample_s"] += time.perf_counter() - t0
        return ReplaySample(indices=indices, weights=weights, data=data)

    # ---------------------------------------------------------------- priorities
    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set ``p_indices[k] = priorities[k]`` (last one wins for repeated indices).

        Indices must be stored slots (``0 <= i < len(self)``); priorities
        finite and >= 0. Raises the max priority seen.
        """
        t0 = time.perf_counter()
        idx = np.asarray(indices)
        if idx.ndim != 1 or not (idx.dtype.kind in "iu" or idx.shape[0] == 0):
            raise ValueError(
                f"indices must be a 1-d integer array, got {idx.dtype}{list(idx.shape)}"
            )
        n = idx.shape[0]
        p, top = self._check_priorities(priorities, n, "update_priorities")
        if n == 0:
            self._times["update_s"] += time.perf_counter() - t0
            return
        idx = idx.astype(np.int64, copy=False)
        if idx.min() < 0 or idx.max() >= self._size:
            raise ValueError(
                f"indices must lie in [0, {self._size}), got [{idx.min()}, {idx.max()}]"
            )
        self._priority[idx] = p  # repeated indices: numpy assigns in order, the last stays
        self._tree.set(idx, self._mass(p))
        self._raise_max(top)
        self._counts["updated"] += n
        self._times["update_s"] += time.perf_counter() - t0

    # ------------------------------------------------------------------- stats
    def stats(self) -> dict[str, float | int]:
        """Counters and cumulative seconds per operation.

        ``size, capacity, added, sampled`` (items drawn), ``evicted`` (items
        overwritten, ``added - size``), ``updated`` (priorities set),
        ``add_s, sample_s, update_s``, and ``max_priority``.
        """
        return {
            "size": self._size,
            "capacity": self.capacity,
            "added": self._counts["added"],
            "sampled": self._counts["sampled"],
            "evicted": self._counts["added"] - self._size,
            "updated": self._counts["updated"],
            **self._times,
            "max_priority": self._max_priority,
        }

    # -------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, np.ndarray | int | float]:
        """Everything needed to continue exactly: a flat dict of arrays and numbers.

        Keys: ``capacity, alpha, eps, size, pos, max_priority``, the counters
        and timers of :meth:`stats`, ``priority`` and ``mass`` (float64 [size]),
        ``rng_state`` (uint64 [6], the PCG64 state) and ``data/<key>`` (copies
        of the stored items). Suitable for ``np.savez``.
        """
        size = self._size
        state: dict[str, np.ndarray | int | float] = {
            "capacity": self.capacity,
            "alpha": self.alpha,
            "eps": self.eps,
            "size": size,
            "pos": self._pos,
            "max_priority": self._max_priority,
            **self._counts,
            **self._times,
            "priority": self._priority[:size].copy(),
            "mass": self._tree.masses(np.arange(size)),
            "rng_state": _pcg64_to_array(self._rng.bit_generator.state),
        }
        if self._storage is not None:
            for k, v in self._storage.items():
                state[f"data/{k}"] = v[:size].copy()
        return state

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore a :meth:`state_dict` (also as loaded back from ``np.load``).

        The capacity, alpha and eps must equal this shard's (``ValueError``).
        """
        for key, mine in (("capacity", self.capacity), ("alpha", self.alpha), ("eps", self.eps)):
            theirs = np.asarray(state[key]).item()
            if theirs != mine:
                raise ValueError(f"state has {key}={theirs}, this shard has {key}={mine}")
        size = int(np.asarray(state["size"]).item())
        pos = int(np.asarray(state["pos"]).item())
        if not (0 <= size <= self.capacity and 0 <= pos < self.capacity):
            raise ValueError(f"state has size={size}, pos={pos} for capacity {self.capacity}")
        priority = np.asarray(state["priority"], dtype=np.float64)
        mass = np.asarray(state["mass"], dtype=np.float64)
        if priority.shape != (size,) or mass.shape != (size,):
            raise ValueError(f"state priority/mass arrays do not have {size} items")
        data = {k[len("data/") :]: np.asarray(v) for k, v in state.items() if k.startswith("data/")}
        if data:
            for k, v in data.items():
                if v.ndim == 0 or v.shape[0] != size:
                    raise ValueError(f"state data/{k} does not have {size} items")
            self._set_schema(data)
            self._allocate()
            for k, v in data.items():
                self._storage[k][:size] = v
        elif size:
            raise ValueError("state has items but no data/<key> arrays")
        else:
            self._storage, self._schema, self._keys = None, {}, frozenset()
            self._records, self._packed = None, ()
        self._priority[:] = 0.0
        self._priority[:size] = priority
        self._tree.load_masses(mass)
        self._size, self._pos = size, pos
        self._max_priority = float(np.asarray(state["max_priority"]).item())
        self._max_mass = self._mass(np.array([self._max_priority]))[0]
        for k in _COUNTERS:
            self._counts[k] = int(np.asarray(state[k]).item())
        for k in _TIMERS:
            self._times[k] = float(np.asarray(state[k]).item())
        self._rng.bit_generator.state = _pcg64_from_array(np.asarray(state["rng_state"]))


def _restore(args: tuple, backend: str, state: dict) -> ReplayShard:
    shard = ReplayShard(*args, backend=backend)
    shard.load_state_dict(state)
    return shard


def _pcg64_to_array(state: dict) -> np.ndarray:
    if state["bit_generator"] != "PCG64":
        raise ValueError(f"only PCG64 generators are supported, got {state['bit_generator']}")
    s, inc = state["state"]["state"], state["state"]["inc"]
    return np.array(
        [s >> 64, s & _MASK64, inc >> 64, inc & _MASK64, state["has_uint32"], state["uinteger"]],
        dtype=np.uint64,
    )


def _pcg64_from_array(a: np.ndarray) -> dict:
    v = [int(x) for x in a]
    return {
        "bit_generator": "PCG64",
        "state": {"state": (v[0] << 64) | v[1], "inc": (v[2] << 64) | v[3]},
        "has_uint32": v[4],
        "uinteger": v[5],
    }
