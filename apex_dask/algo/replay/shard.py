"""One prioritized replay shard: a ring of transitions plus a sum/min tree.

Pure numpy (+ numba kernels); no Dask here. The runtime wraps it in an actor;
the in-process runner uses it directly. The shard composes three parts, each
owning its data and its checkpoint keys (:mod:`apex_dask.algo.replay.state`):
the items and the ring's cursor (:class:`~apex_dask.algo.replay.storage.ItemStorage`),
the priorities and their sum/min tree
(:class:`~apex_dask.algo.replay.priorities.Priorities`) and, with
``frame_stack``, the frames, each kept once
(:class:`~apex_dask.algo.replay.frames.FrameStore`). The shard itself owns
the sampling rng, the counters and the timers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from apex_dask.algo.replay.codec import decode_batch
from apex_dask.algo.replay.frames import FrameStore, user_keys
from apex_dask.algo.replay.priorities import Priorities
from apex_dask.algo.replay.sample import ReplaySample, item_checksums
from apex_dask.algo.replay.state import (
    COUNTERS,
    TIMERS,
    check_same,
    pcg64_from_array,
    pcg64_to_array,
)
from apex_dask.algo.replay.storage import (
    REQUIRED_KEYS,
    ItemStorage,
    Schema,
    check_required,
    ring_spans,
)

__all__ = ["REQUIRED_KEYS", "ReplayShard", "ReplaySample"]


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
    (:class:`~apex_dask.algo.replay.sumtree.SumMinTree`) whose nodes are recomputed
    from their children, so they never drift from their leaves.

    The schema (keys, dtypes, per-item shapes) is fixed by the first ``add``;
    ``obs, action, reward, next_obs, done`` are required, extra keys (e.g.
    ``discount``) are stored too (see
    :class:`~apex_dask.algo.replay.storage.ItemStorage`). When the ring is
    full the oldest items are overwritten. Indices are slots; a sample also
    carries each item's *generation* (the slot's write stamp), and a priority
    update given them reaches only the items it was computed for: an item
    overwritten since its sample keeps its new priority, and the skipped update
    is counted (``stale_priority_updates``).

    **Frame stacks.** With ``frame_stack=k``, ``obs`` and ``next_obs`` items
    are stacks ``[k, *frame_shape]`` (first axis the stack, as gymnasium's
    ``FrameStackObservation`` gives) and each frame is kept once
    (:mod:`apex_dask.algo.replay.frames`): about 1.12 frames per transition
    instead of ``2k``. ``add`` takes full stacks or the compact form of
    :mod:`apex_dask.algo.replay.codec` (what env workers send); ``sample``
    returns the stacks that were added, bit for bit. Items whose frames had to
    be overwritten are evicted early, oldest first (their updates are stale too).
    Without ``frame_stack`` a compact batch is decoded and stored whole.

    Usage::

        shard = ReplayShard(2**20, alpha=0.6, seed=0)
        shard.add(rollout, priorities=initial_td)   # rollout: dict of arrays
        s = shard.sample(512, beta=0.4)              # s.indices, .weights, .data, .generations
        shard.update_priorities(s.indices, np.abs(td_error), s.generations)

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
        self._items = ItemStorage(capacity, evicts_early=self._frames is not None)
        self._priorities = Priorities(capacity, self.alpha, self.eps, backend=backend)
        self._rng = np.random.default_rng(seed)
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._times = dict.fromkeys(TIMERS, 0.0)

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return self._items.size

    def __reduce__(self) -> tuple:
        # Pickle through state_dict: compact (stored items only), and the
        # per-key views into the record array are rebuilt, not copied apart.
        args = (self.capacity, self.alpha, self.eps, None, self.frame_stack)
        return (_restore, (args, self.backend, self.state_dict()))

    @property
    def backend(self) -> str:
        """The tree backend in use: ``"numba"`` or ``"numpy"``."""
        return self._priorities.tree.backend

    @property
    def max_priority(self) -> float:
        """Largest priority seen so far (1.0 before any was given)."""
        return self._priorities.max_priority

    @property
    def added(self) -> int:
        """Items ever added (``stats()["added"]``)."""
        return self._counts["added"]

    @property
    def schema(self) -> Schema:
        """The keys ``add`` takes and ``sample`` returns, with their per-item dtypes and
        shapes (stacks for ``obs`` / ``next_obs`` with ``frame_stack``); ``{}`` before
        the first ``add``."""
        items = self._items.schema
        if items is None:
            return {}
        return items if self._frames is None else self._frames.user_schema(items)

    @property
    def items(self) -> ItemStorage:
        """The item storage (read it, e.g. its ``arrays``; change it only through the shard)."""
        return self._items

    def stored_slots(self) -> np.ndarray:
        """The slots of the items stored, newest first (int64 [len(self)])."""
        return self._items.stored_slots()

    def items_at(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """The items at ``slots`` (as :meth:`sample` returns them), one array per key."""
        data = self._items.gather(slots)
        return data if self._frames is None else self._frames.stacks(data)

    # --------------------------------------------------------------------- add
    def add(
        self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None
    ) -> np.ndarray:
        """Store the ``n`` items of ``batch`` (dict of arrays, equal first dims).

        Item ``k`` goes to slot ``(pos + k) % capacity`` with priority
        ``priorities[k]``, or the largest priority seen so far when None.
        Returns those slots (int64 [n]). If ``n > capacity`` only the last
        ``capacity`` items remain stored (with ``frame_stack``: their slots
        are -1 for the items not stored). A batch that raises stores nothing.
        """
        t0 = time.perf_counter()
        if self._frames is not None:
            slots, n, top = self._add_stacked(batch, priorities)
        else:
            if "frames" in batch:
                batch = decode_batch(batch)
            items = self._items
            if items.schema is None:  # a rejected first batch fixes no schema
                check_required(batch)
            n, arrays = items.check(batch)
            p, top = (
                (None, None) if priorities is None else self._priorities.check(priorities, n, "add")
            )
            slots = self._write(arrays, p, n)
        if top is not None:
            self._priorities.raise_max(top)
        self._counts["added"] += n
        self._times["add_s"] += time.perf_counter() - t0
        return slots

    def _add_stacked(
        self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None
    ) -> tuple[np.ndarray, int, float | None]:
        """``add`` with ``frame_stack``: the slots (-1: not stored), the items, the top priority.

        The frame store encodes (or checks) the batch and writes its frames;
        the items, with their frames' ring slots, go to the item storage;
        then the items whose frames were overwritten are evicted.
        """
        frames, items = self._frames, self._items
        stacked, item_batch = frames.split(batch)
        if items.schema is None:
            check_required(user_keys(item_batch))
        n, arrays = items.check(item_batch)
        p, top = (
            (None, None) if priorities is None else self._priorities.check(priorities, n, "add")
        )
        first, arrays = frames.add(*stacked, arrays, max_items=self.capacity)
        if n == 0:
            return items.add(arrays, 0), 0, top  # fixes the schema
        p = p[first:] if first and p is not None else p
        slots = self._write(arrays, p, n - first)
        live = frames.commit(n - first, items.size)
        if live < items.size:
            self._priorities.clear(*items.keep_newest(live))
        return (np.concatenate([np.full(first, -1, np.int64), slots]) if first else slots), n, top

    def _write(self, arrays: Mapping[str, np.ndarray], p: np.ndarray | None, n: int) -> np.ndarray:
        """Items to the item storage, their priorities to the same slots; returns the slots."""
        pos = self._items.pos
        slots = self._items.add(arrays, n)
        if pos + n <= self.capacity:  # the common case: one range
            self._priorities.set_range(pos, p, n)
        else:  # only the last `capacity` items survive
            for start, count, first in ring_spans(pos, n, self.capacity):
                pr = None if p is None else p[first : first + count]
                self._priorities.set_range(start, pr, count)
        return slots

    # ------------------------------------------------------------------ sample
    def sample(self, batch_size: int, beta: float) -> ReplaySample:
        """Draw ``batch_size`` items iid with probability ``P(i)``; weights ``w_i`` (see class)."""
        t0 = time.perf_counter()
        if self._items.size == 0:
            raise ValueError("cannot sample from an empty replay shard")
        batch_size = int(batch_size)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not (np.isfinite(beta) and beta >= 0.0):
            raise ValueError(f"beta must be finite and >= 0, got {beta}")
        if not self._priorities.total > 0.0:
            raise ValueError(
                "all stored items have mass 0 (priority 0 with eps=0): nothing to sample"
            )
        indices, weights = self._priorities.sample(self._rng.random(batch_size), beta)
        data = self.items_at(indices)
        generations = self._items.generation.take(indices)
        self._counts["sampled"] += batch_size
        self._times["sample_s"] += time.perf_counter() - t0
        return ReplaySample(indices, weights, data, generations, 0, self._counts["added"])

    # ---------------------------------------------------------------- priorities
    def update_priorities(
        self,
        indices: np.ndarray,
        priorities: np.ndarray,
        generations: np.ndarray | None = None,
    ) -> int:
        """Set ``p_indices[k] = priorities[k]`` (last one wins for repeated indices).

        ``generations`` are the ones :meth:`sample` returned with ``indices``:
        an item whose slot was rewritten (or evicted early) since then is gone,
        and its update is skipped (it keeps the priority it has now) and counted
        in ``stats()["stale_priority_updates"]``. Returns the updates skipped so.
        ``generations=None``: every update lands on what the slots hold now.

        With ``generations``, a slot not written here (a shard rebuilt or restored since
        the sample) is stale too; indices must lie in ``[0, capacity)`` (without: in
        ``[0, filled)``); priorities finite, >= 0. Raises the max priority seen.
        """
        t0 = time.perf_counter()
        idx = self._items.check_slots(indices, written=generations is None)
        n = idx.shape[0]
        p, top = self._priorities.check(priorities, n, "update_priorities")
        live = self._items.reached(idx, generations)
        if n == 0:
            self._times["update_s"] += time.perf_counter() - t0
            return 0
        stale = 0
        if live is not None and not live.all():  # leave those items as they are now
            stale = n - int(live.sum())
            idx, p = idx[live], p[live]
            top = float(p.max()) if p.size else 0.0
        self._priorities.set(idx, p)
        self._priorities.raise_max(top)
        self._counts["updated"] += n - stale
        self._counts["stale_priority_updates"] += stale
        self._times["update_s"] += time.perf_counter() - t0
        return stale

    def audit(
        self, indices: np.ndarray, generations: np.ndarray, checksums: np.ndarray
    ) -> tuple[int, int]:
        """Check a priority update before it is applied: of the items it still reaches
        (same slot, same generation), how many hold data whose :func:`item_checksums`
        differ from ``checksums`` (those of the items the learner trained on).
        ``(items checked, items that differ)``; a correct run has 0 differing."""
        idx = np.asarray(indices, np.int64)
        live = self._items.current(idx, np.asarray(generations))
        sums = item_checksums(self.items_at(idx[live]))
        return int(live.sum()), int(np.count_nonzero(sums != np.asarray(checksums)[live]))

    # ------------------------------------------------------------------- stats
    def stats(self) -> dict[str, float | int]:
        """Counters and cumulative seconds per operation.

        ``size`` (items stored now), ``capacity``, ``added`` (items ever
        added), ``sampled`` (items drawn, counting repeats), ``evicted``
        (items overwritten or evicted early, ``added - size``), ``updated``
        (priorities set), ``stale_priority_updates`` (priority updates skipped: their item
        was overwritten or evicted after it was sampled), ``add_s, sample_s,
        update_s``, ``max_priority``, and
        ``bytes``: the bytes of every array the shard allocated (items, frames,
        priorities, trees).
        """
        nbytes = self._priorities.nbytes + self._items.nbytes
        nbytes += self._frames.nbytes if self._frames is not None else 0
        size = self._items.size
        return {
            "size": size,
            "capacity": self.capacity,
            "added": self._counts["added"],
            "sampled": self._counts["sampled"],
            "evicted": self._counts["added"] - size,
            "updated": self._counts["updated"],
            "stale_priority_updates": self._counts["stale_priority_updates"],
            **self._times,
            "max_priority": self._priorities.max_priority,
            "bytes": int(nbytes),
        }

    # -------------------------------------------------------------- checkpoint
    def state_dict(self, max_items: int | None = None) -> dict[str, np.ndarray | int | float]:
        """Everything needed to continue exactly: a flat dict of arrays and numbers.

        The shard's own keys, its item storage's and (with ``frame_stack``)
        its frame store's; the format is in :mod:`apex_dask.algo.replay.state`.
        Suitable for ``np.savez``. ``max_items`` (< ``len(self)``): as if the shard held
        only its newest ``max_items`` items (only they are copied; "Newest items" there)."""
        items, frames = self._items, self._frames
        keep = items.size if max_items is None else max(0, min(items.size, int(max_items)))
        if keep == items.size:
            p, i = self._priorities.state_dict(items.filled), items.state_dict()
            f = {} if frames is None else frames.state_dict()
        else:
            slots = items.stored_slots()[:keep][::-1].copy()  # the newest, oldest first
            p, i = self._priorities.state_dict_at(slots), items.state_dict_at(slots)
            f = {} if frames is None else frames.state_dict(newest_items=keep)
        own = {"capacity": self.capacity, "alpha": self.alpha, "eps": self.eps}
        rng = pcg64_to_array(self._rng.bit_generator.state)
        return {**own, **self._counts, **self._times, "rng_state": rng, **p, **i, **f}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore a :meth:`state_dict` (also as loaded back from ``np.load``).

        The capacity, alpha, eps and frame_stack must equal this shard's
        (``ValueError``). A state that does not fit raises before anything changes.
        """
        mine = {"capacity": self.capacity, "alpha": self.alpha, "eps": self.eps}
        check_same(state, {**mine, "frame_stack": self.frame_stack})
        items = ItemStorage(self.capacity, evicts_early=self._frames is not None)
        items.load_state_dict(state)
        frames = None
        if self._frames is not None:
            frames = FrameStore(self.capacity, self.frame_stack)
            frames.load_state_dict(state)
        rng_state = pcg64_from_array(np.asarray(state["rng_state"]))
        counts = {k: int(np.asarray(state.get(k, 0)).item()) for k in COUNTERS}
        times = {k: float(np.asarray(state[k]).item()) for k in TIMERS}
        self._priorities.load_state_dict(state, items.filled)  # the last check
        self._items, self._frames = items, frames
        if items.filled > items.size:  # slots evicted early stay empty
            self._priorities.clear(*items.evicted_span())
        self._counts.update(counts)
        self._times.update(times)
        self._rng.bit_generator.state = rng_state


def _restore(args: tuple, backend: str, state: dict) -> ReplayShard:
    shard = ReplayShard(*args, backend=backend)
    shard.load_state_dict(state)
    return shard
