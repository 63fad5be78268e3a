"""One prioritized replay shard: a ring of transitions plus a sum/min tree.

Pure numpy (+ numba kernels); no Dask here. The runtime wraps it in an actor;
the in-process runner uses it directly. The items live in
:mod:`apex_dask.algo.replay_storage`, the frames of frame-stacked
observations in :mod:`apex_dask.algo.frame_storage`; this module holds the
priorities and the sampling.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from apex_dask.algo.frame_codec import decode_batch
from apex_dask.algo.frame_storage import REF_KEYS, FrameStore, add_stacked
from apex_dask.algo.replay_checkpoint import load_shard_state, shard_state
from apex_dask.algo.replay_storage import (
    REQUIRED_KEYS,
    ItemStorage,
    Schema,
    check_required,
    schema_of,
)
from apex_dask.algo.sumtree import SumMinTree

__all__ = ["REQUIRED_KEYS", "ReplayShard", "ReplaySample"]

_COUNTERS = ("added", "sampled", "updated")
_TIMERS = ("add_s", "sample_s", "update_s")


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
    ``discount``) are stored too (see
    :class:`~apex_dask.algo.replay_storage.ItemStorage`). When the ring is
    full the oldest items are overwritten. Indices are slots: an index refers
    to whatever item sits in that slot now.

    **Frame stacks.** With ``frame_stack=k``, ``obs`` and ``next_obs`` items
    are stacks ``[k, *frame_shape]`` (first axis the stack, as gymnasium's
    ``FrameStackObservation`` gives) and each frame is kept once
    (:mod:`apex_dask.algo.frame_storage`): about 1.12 frames per transition
    instead of ``2k``. ``add`` takes full stacks or the compact form of
    :mod:`apex_dask.algo.frame_codec` (what env workers send); ``sample``
    returns the stacks that were added, bit for bit. Items whose frames had to
    be overwritten are evicted early, oldest first; ``update_priorities``
    skips such slots. Without ``frame_stack`` a compact batch is decoded and
    stored whole.

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
        frame_stack: int | None = None,
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
        self.frame_stack = None if frame_stack is None else int(frame_stack)
        self._frames = None if frame_stack is None else FrameStore(capacity, frame_stack)
        self._tree = SumMinTree(capacity, backend=backend)
        self._rng = np.random.default_rng(seed)
        self._priority = np.zeros(capacity, np.float64)
        self._store: ItemStorage | None = None
        self._schema: Schema = {}  # the keys add() takes and sample() returns
        self._size = 0  # items stored: the newest `size` slots before `pos`
        self._pos = 0
        self._filled = 0  # slots ever written (== size unless frames evicted items early)
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
        args = (self.capacity, self.alpha, self.eps, None, self.frame_stack)
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
    def add(
        self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None
    ) -> np.ndarray:
        """Store the ``n`` items of ``batch`` (dict of arrays, equal first dims).

        Item ``k`` goes to slot ``(pos + k) % capacity`` with priority
        ``priorities[k]``, or the largest priority seen so far when None.
        Returns those slots (int64 [n]). If ``n > capacity`` only the last
        ``capacity`` items remain stored (with ``frame_stack``: their slots
        are -1 for the items not stored).
        """
        t0 = time.perf_counter()
        if self._frames is not None:
            slots, n, top = add_stacked(self, batch, priorities)
        else:
            if "frames" in batch:
                batch = decode_batch(batch)
            store = self._store
            if store is None:  # a rejected first batch fixes no schema
                check_required(batch)
                store = ItemStorage(self.capacity, schema_of(batch))
            n, arrays = store.check(batch)
            p, top = (
                (None, None) if priorities is None else self._check_priorities(priorities, n, "add")
            )
            self._store, self._schema = store, store.schema
            pos = self._pos
            end = pos + n
            if end < self.capacity:  # the common case, inline: one slice per key
                slots = np.arange(pos, end, dtype=np.int64)
                dst = store.arrays
                for k, a in arrays.items():
                    dst[k][pos:end] = a
                self._set_priorities_range(pos, p, n)
                self._pos = end
                self._size = self._filled = min(self.capacity, self._size + n)
            else:
                slots = self._write(arrays, p, n)
        if top is not None:
            self._raise_max(top)
        self._counts["added"] += n
        self._times["add_s"] += time.perf_counter() - t0
        return slots

    def _write(self, arrays: Mapping[str, np.ndarray], p: np.ndarray | None, n: int) -> np.ndarray:
        """Items and priorities to the next ``n`` slots; returns the slots."""
        cap, pos = self.capacity, self._pos
        end = pos + n
        slots = np.arange(pos, end, dtype=np.int64)
        self._store.write(pos, arrays, n)
        if end <= cap:  # the common case: one range
            self._set_priorities_range(pos, p, n)
        else:  # only the last `cap` items survive: [start, cap) and [0, n - skip - n1)
            slots %= cap
            skip = max(0, n - cap)
            start = (pos + skip) % cap
            n1 = min(n - skip, cap - start)
            if p is None:
                self._set_priorities_range(start, None, n1)
                self._set_priorities_range(0, None, n - skip - n1)
            else:
                self._set_priorities_range(start, p[skip : skip + n1])
                self._set_priorities_range(0, p[skip + n1 :])
        self._pos = end % cap
        self._size = min(cap, self._size + n)
        self._filled = min(cap, self._filled + n)
        return slots

    def _set_priorities_range(self, start: int, p: np.ndarray | None, count: int = -1) -> None:
        """Priorities of the slots from ``start``: ``p``, or the max priority for ``count``."""
        if p is None:
            self._tree.fill_range(start, count, self._max_mass)
            self._priority[start : start + count] = self._max_priority
        else:
            self._tree.set_range(start, self._mass(p))
            self._priority[start : start + p.shape[0]] = p

    def _clear(self, start: int, count: int) -> None:
        """Empty ``count`` slots from ``start`` (wrapping): never sampled again."""
        n1 = min(count, self.capacity - start)
        for a, c in ((start, n1), (0, count - n1)):
            self._tree.clear_range(a, c)
            self._priority[a : a + c] = 0.0

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
        data = self._store.gather(indices)
        if self._frames is not None:
            data = {
                REF_KEYS[k] if k in REF_KEYS else k: self._frames.gather(v) if k in REF_KEYS else v
                for k, v in data.items()
            }
        self._counts["sampled"] += batch_size
        self._times["sample_s"] += time.perf_counter() - t0
        return ReplaySample(indices=indices, weights=weights, data=data)

    # ---------------------------------------------------------------- priorities
    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set ``p_indices[k] = priorities[k]`` (last one wins for repeated indices).

        Indices must be written slots (``0 <= i < len(self)`` unless items were
        evicted early, which are skipped); priorities finite and >= 0. Raises
        the max priority seen.
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
        if idx.min() < 0 or idx.max() >= self._filled:
            raise ValueError(
                f"indices must lie in [0, {self._filled}), got [{idx.min()}, {idx.max()}]"
            )
        if self._size < self._filled:  # slots evicted early: leave them empty
            live = (self._pos - 1 - idx) % self.capacity < self._size
            idx, p = idx[live], p[live]
        self._priority[idx] = p  # repeated indices: numpy assigns in order, the last stays
        self._tree.set(idx, self._mass(p))
        self._raise_max(top)
        self._counts["updated"] += n
        self._times["update_s"] += time.perf_counter() - t0

    # ------------------------------------------------------------------- stats
    def stats(self) -> dict[str, float | int]:
        """Counters and cumulative seconds per operation.

        ``size, capacity, added, sampled`` (items drawn), ``evicted`` (items
        overwritten or evicted early, ``added - size``), ``updated``
        (priorities set), ``add_s, sample_s, update_s``, ``max_priority``, and
        ``bytes``: the bytes of every array the shard allocated (items, frames,
        priorities, trees).
        """
        nbytes = self._priority.nbytes + self._tree.nbytes
        nbytes += self._store.nbytes if self._store is not None else 0
        nbytes += self._frames.nbytes if self._frames is not None else 0
        return {
            "size": self._size,
            "capacity": self.capacity,
            "added": self._counts["added"],
            "sampled": self._counts["sampled"],
            "evicted": self._counts["added"] - self._size,
            "updated": self._counts["updated"],
            **self._times,
            "max_priority": self._max_priority,
            "bytes": int(nbytes),
        }

    # -------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, np.ndarray | int | float]:
        """Everything needed to continue exactly: a flat dict of arrays and numbers.

        Keys: ``capacity, alpha, eps, size, pos, max_priority``, the counters
        and timers of :meth:`stats`, ``priority`` and ``mass`` (float64 [size]),
        ``rng_state`` (uint64 [6], the PCG64 state) and ``data/<key>`` (copies
        of the stored items). Suitable for ``np.savez``. A frame-stacked shard
        saves its frames once each (see :mod:`apex_dask.algo.replay_checkpoint`).
        """
        return shard_state(self)

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore a :meth:`state_dict` (also as loaded back from ``np.load``).

        The capacity, alpha, eps and frame_stack must equal this shard's
        (``ValueError``).
        """
        load_shard_state(self, state)


def _restore(args: tuple, backend: str, state: dict) -> ReplayShard:
    shard = ReplayShard(*args, backend=backend)
    shard.load_state_dict(state)
    return shard
