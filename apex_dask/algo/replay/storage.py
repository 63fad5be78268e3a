"""Per-item storage of a replay shard: one array per key over a ring of slots.

:class:`ItemStorage` owns the items and the ring's bookkeeping (where the
next item goes, which slots hold stored items) and their checkpoint state.
The priorities live in :mod:`apex_dask.algo.replay.shard`; the frames of
frame-stacked observations in :mod:`apex_dask.algo.replay.frames`. Pure numpy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping

import numpy as np

__all__ = [
    "GENERATION_EPOCH",
    "REQUIRED_KEYS",
    "ItemStorage",
    "Schema",
    "check_required",
    "ring_spans",
    "schema_of",
]

REQUIRED_KEYS: tuple[str, ...] = ("obs", "action", "reward", "next_obs", "done")
"""Keys every batch added to a replay shard must have."""

PACK_BYTES = 128
"""Keys up to this many bytes per item are stored in one record array."""

Schema = dict[str, tuple[np.dtype, tuple[int, ...]]]
"""Per key: the dtype and the shape of one item."""

GENERATION_EPOCH = 1 << 40
"""How far past the state's clock (or the wall clock in ns) a restore moves the write
clock (see :class:`ItemStorage`)."""


def schema_of(arrays: Mapping[str, np.ndarray]) -> Schema:
    """The schema of a batch of arrays (first axis: items), or ``ValueError``."""
    schema: Schema = {}
    for k, v in arrays.items():
        a = np.asarray(v)
        if a.ndim == 0:
            raise ValueError(f"batch[{k!r}] must have a first (batch) dimension")
        schema[k] = (a.dtype, a.shape[1:])
    return schema


def ring_spans(pos: int, n: int, capacity: int) -> tuple[tuple[int, int, int], ...]:
    """Where items ``0..n-1`` written from slot ``pos`` of a ring land: ``(slot, count, item)``.

    Each span puts items ``item .. item+count-1`` into slots ``slot ..
    slot+count-1``. Only the last ``capacity`` items stay, so the first
    ``max(0, n - capacity)`` are in no span.
    """
    if pos + n <= capacity:
        return ((pos, n, 0),)
    skip = max(0, n - capacity)
    start = (pos + skip) % capacity
    n1 = min(n - skip, capacity - start)
    return ((start, n1, skip), (0, n - skip - n1, skip + n1))


def check_required(keys: Iterable[str]) -> None:
    """``ValueError`` naming the :data:`REQUIRED_KEYS` missing from ``keys``."""
    keys = set(keys)
    missing = [k for k in REQUIRED_KEYS if k not in keys]
    if missing:
        raise ValueError(f"batch lacks required key(s) {missing}; it has {sorted(keys)}")


class ItemStorage:
    """``capacity`` slots of items in a ring; owns the items, the cursor and their checkpoint.

    Owns: the per-key arrays (the :data:`Schema` is fixed by the first
    :meth:`add`), ``pos`` (the slot the next item goes to), ``filled`` (slots
    ever written) and ``size`` (items stored: the newest ``size`` slots before
    ``pos``). ``size == filled`` unless the owner evicted the oldest items
    early (:meth:`keep_newest`; only a storage made with ``evicts_early``,
    whose checkpoint then also records ``filled``).

    **Generations.** Every write of a slot stamps it with the storage's write
    clock (``generation[slot]``; the clock counts the items ever written), so
    ``(slot, generation)`` names one item for good: a slot rewritten since it
    was read has another generation. The clock starts at the wall clock in
    nanoseconds, so a shard rebuilt empty after a fault never stamps an item
    the way the lost one did. A restore (a checkpoint, or another
    shard's items handed over) moves the clock past everything any earlier
    copy of this shard can have written: to the later of the state's clock and
    the wall clock in nanoseconds, plus :data:`GENERATION_EPOCH`. So restoring
    the same checkpoint twice, or restoring an older checkpoint after a
    hand-over, never gives a new item the generation of an item written
    after the earlier restore: a priority update computed for that item can
    never land on the new one. (Between two restores a shard writes far fewer
    items than nanoseconds pass.)

    Keys of at most :data:`PACK_BYTES` per item share one record array, so a
    gathered item costs a cache line or two, not one per key; larger keys
    (images) get an array of their own.

    Usage (by :class:`~apex_dask.algo.replay.shard.ReplayShard`)::

        items = ItemStorage(capacity)
        n, arrays = items.check(batch)     # ValueError for a bad batch; nothing changed
        slots = items.add(arrays, n)       # int64 [n]; pos, size, filled advance
        data = items.gather(slots)         # {key: array [len(slots), ...]}
    """

    def __init__(self, capacity: int, *, evicts_early: bool = False) -> None:
        self.capacity = int(capacity)
        self.evicts_early = bool(evicts_early)
        self._empty()

    def _empty(self) -> None:
        self.schema: Schema | None = None  # fixed by the first add
        self.keys: frozenset[str] = frozenset()
        self.records: np.ndarray | None = None
        self.packed: tuple[str, ...] = ()
        self.arrays: dict[str, np.ndarray] = {}
        self.pos = 0
        self.size = 0
        self.filled = 0
        self.generation = np.zeros(self.capacity, np.int64)
        self.clock = time.time_ns()  # a rebuilt, empty shard never repeats a lost one's

    def _allocate(self, schema: Schema) -> None:
        capacity = self.capacity
        small = [
            (k, dtype, shape)
            for k, (dtype, shape) in schema.items()
            if dtype.itemsize * math.prod(shape) <= PACK_BYTES and not dtype.hasobject
        ]
        self.schema = dict(schema)
        self.keys = frozenset(schema)
        self.records = np.empty(capacity, np.dtype(small, align=True)) if small else None
        self.packed = tuple(k for k, _, _ in small)
        self.arrays = {
            k: self.records[k] if k in self.packed else np.empty((capacity, *shape), dtype)
            for k, (dtype, shape) in schema.items()
        }

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays allocated."""
        own = sum(v.nbytes for k, v in self.arrays.items() if k not in self.packed)
        return own + (0 if self.records is None else self.records.nbytes)

    # ---------------------------------------------------------------- writing
    def check(self, batch: Mapping[str, np.ndarray]) -> tuple[int, Mapping[str, np.ndarray]]:
        """Number of items in ``batch`` and its arrays, or ``ValueError`` naming a bad key.

        Before the first :meth:`add` the batch is checked against its own schema.
        Changes nothing.
        """
        if self.schema is None:
            schema, keys = schema_of(batch), batch.keys()
        else:
            schema, keys = self.schema, self.keys
            if batch.keys() != keys:
                extra = sorted(set(batch) - keys)
                missing = sorted(keys - set(batch))
                key = (missing or extra)[0]
                raise ValueError(
                    f"batch key {key!r} does not match the schema "
                    f"(missing {missing}, extra {extra})"
                )
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

    def add(self, arrays: Mapping[str, np.ndarray], n: int) -> np.ndarray:
        """Store :meth:`check`'s ``n`` items at slots ``(pos + i) % capacity``; returns them.

        Only the last ``capacity`` items stay. The first add fixes the schema
        (also with ``n = 0``).
        """
        if self.schema is None:
            self._allocate(schema_of(arrays))
        cap, pos = self.capacity, self.pos
        end = pos + n
        slots = np.arange(pos, end, dtype=np.int64)
        dst = self.arrays
        gen, clock = self.generation, self.clock
        if end <= cap:  # the common case: one slice per key
            for k, a in arrays.items():
                dst[k][pos:end] = a
            gen[pos:end] = np.arange(clock + 1, clock + n + 1)
        else:
            slots %= cap
            for slot, count, first in ring_spans(pos, n, cap):
                for k, a in arrays.items():
                    dst[k][slot : slot + count] = a[first : first + count]
                gen[slot : slot + count] = np.arange(clock + first + 1, clock + first + count + 1)
        self.clock = clock + n
        self.pos = end % cap
        self.size = min(cap, self.size + n)
        self.filled = min(cap, self.filled + n)
        return slots

    def keep_newest(self, count: int) -> tuple[int, int]:
        """Evict all but the newest ``count`` items early; ``(first slot, slots)`` evicted.

        The evicted slots (wrapping from the first) keep their data but are
        no longer stored.
        """
        if not self.evicts_early:
            raise ValueError("this item storage does not evict items early")
        evicted = max(0, self.size - int(count))
        start = (self.pos - self.size) % self.capacity
        self.size -= evicted
        return start, evicted

    def evicted_span(self) -> tuple[int, int]:
        """``(first slot, slots)`` written but evicted early (wrapping from the first)."""
        return (self.pos - self.filled) % self.capacity, self.filled - self.size

    # ---------------------------------------------------------------- reading
    def stored(self, slots: np.ndarray) -> np.ndarray:
        """Which of ``slots`` (written ones, int64) hold stored items (bool)."""
        return (self.pos - 1 - slots) % self.capacity < self.size

    def check_slots(self, slots: object, *, written: bool = True) -> np.ndarray:
        """``slots`` as int64, or ``ValueError`` unless a 1-d integer array of written slots
        (``written=False``: of slots of the ring, written or not)."""
        idx = np.asarray(slots)
        if idx.ndim != 1 or not (idx.dtype.kind in "iu" or idx.shape[0] == 0):
            raise ValueError(
                f"indices must be a 1-d integer array, got {idx.dtype}{list(idx.shape)}"
            )
        idx = idx.astype(np.int64, copy=False)
        end = self.filled if written else self.capacity
        if idx.shape[0] and (idx.min() < 0 or idx.max() >= end):
            raise ValueError(f"indices must lie in [0, {end}), got [{idx.min()}, {idx.max()}]")
        return idx

    def current(self, slots: np.ndarray, generations: np.ndarray) -> np.ndarray:
        """Which of ``slots`` (int64) still hold the items that had ``generations`` and
        are stored (bool): neither rewritten nor evicted since. A slot this storage has
        not written (a rebuilt or restored shard holding fewer items than the one
        sampled) holds none of them."""
        held = (slots >= 0) & (slots < self.filled)
        same = np.zeros(slots.shape, bool)
        same[held] = self.generation[slots[held]] == generations[held]
        if self.size < self.filled:
            same &= self.stored(np.where(held, slots, 0))
        return same

    def reached(self, slots: np.ndarray, generations: object | None) -> np.ndarray | None:
        """Which of ``slots`` an update reaches: :meth:`current` with ``generations``
        (``ValueError`` unless one integer per slot); without them, the stored ones
        (None: all of them)."""
        if generations is not None:
            gen = np.asarray(generations)
            if gen.shape != slots.shape or gen.dtype.kind not in "iu":
                raise ValueError(
                    f"update_priorities: expected {slots.shape[0]} integer generations, "
                    f"got {gen.dtype}{list(gen.shape)}"
                )
            return self.current(slots, gen)
        return self.stored(slots) if self.size < self.filled else None

    def stored_slots(self) -> np.ndarray:
        """The slots of the stored items, newest first (int64 [size])."""
        return (self.pos - 1 - np.arange(self.size, dtype=np.int64)) % self.capacity

    def gather(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """The items at ``indices``, one array per key (in schema order)."""
        records = None if self.records is None else self.records.take(indices)
        return {
            k: np.ascontiguousarray(records[k]) if k in self.packed else v.take(indices, axis=0)
            for k, v in self.arrays.items()
        }

    # ------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, np.ndarray | int]:
        """``size``, ``pos``, ``clock``, ``generation`` and ``data/<key>`` (copies of slots
        ``0..filled-1``) and, with ``evicts_early``, ``filled``."""
        state: dict[str, np.ndarray | int] = {
            "size": self.size,
            "pos": self.pos,
            "clock": self.clock,
            "generation": self.generation[: self.filled].copy(),
        }
        if self.evicts_early:
            state["filled"] = self.filled
        for k, v in self.arrays.items():
            state[f"data/{k}"] = v[: self.filled].copy()
        return state

    def state_dict_at(self, slots: np.ndarray) -> dict[str, np.ndarray | int]:
        """:meth:`state_dict` of a storage holding only the items of ``slots`` (stored
        ones), moved to slots ``0 .. len(slots) - 1`` in that order: ``pos`` follows them."""
        n = int(len(slots))
        state: dict[str, np.ndarray | int] = {
            "size": n,
            "pos": n % self.capacity,
            "clock": self.clock,
            "generation": self.generation[slots],
        }
        if self.evicts_early:
            state["filled"] = n
        if self.schema is not None:
            for k, v in self.gather(np.asarray(slots, np.int64)).items():
                state[f"data/{k}"] = v
        return state

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore :meth:`state_dict` (``ValueError`` when it does not fit; nothing changed then).

        ``filled`` defaults to ``size``; without ``data/<key>`` arrays (an
        empty storage) no schema is fixed. A state without ``generation`` (written
        before generations existed) gives every stored item generation 0. The
        write clock goes on from the later of the state's and ``time.time_ns()``,
        plus :data:`GENERATION_EPOCH` (see the class docstring).
        """
        size = int(np.asarray(state["size"]).item())
        pos = int(np.asarray(state["pos"]).item())
        filled = int(np.asarray(state.get("filled", size)).item())
        if not (0 <= size <= filled <= self.capacity and 0 <= pos < self.capacity):
            raise ValueError(f"state has size={size}, pos={pos} for capacity {self.capacity}")
        data = {k[len("data/") :]: np.asarray(v) for k, v in state.items() if k.startswith("data/")}
        for k, v in data.items():
            if v.ndim == 0 or v.shape[0] != filled:
                raise ValueError(f"state data/{k} does not have {filled} items")
        if filled and not data:
            raise ValueError("state has items but no data/<key> arrays")
        generation = np.asarray(state.get("generation", np.zeros(filled, np.int64)))
        if generation.shape != (filled,) or generation.dtype.kind not in "iu":
            raise ValueError(f"state generation does not have {filled} integer items")
        clock = int(np.asarray(state.get("clock", 0)).item())
        self._empty()
        if data:
            self._allocate(schema_of(data))
            for k, v in data.items():
                self.arrays[k][:filled] = v
        self.size, self.pos, self.filled = size, pos, filled
        self.generation[:filled] = generation
        self.clock = max(clock, int(generation.max(initial=0)), time.time_ns()) + GENERATION_EPOCH
