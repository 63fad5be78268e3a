"""Per-item storage of a replay shard: one array per key over a ring of slots.

The priorities live in :mod:`apex_dask.algo.replay`; the frames of
frame-stacked observations in :mod:`apex_dask.algo.frame_storage`. Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

__all__ = ["REQUIRED_KEYS", "ItemStorage", "Schema", "check_required", "schema_of"]

REQUIRED_KEYS: tuple[str, ...] = ("obs", "action", "reward", "next_obs", "done")
"""Keys every batch added to a replay shard must have."""

PACK_BYTES = 128
"""Keys up to this many bytes per item are stored in one record array."""

Schema = dict[str, tuple[np.dtype, tuple[int, ...]]]
"""Per key: the dtype and the shape of one item."""


def schema_of(arrays: Mapping[str, np.ndarray]) -> Schema:
    """The schema of a batch of arrays (first axis: items), or ``ValueError``."""
    schema: Schema = {}
    for k, v in arrays.items():
        a = np.asarray(v)
        if a.ndim == 0:
            raise ValueError(f"batch[{k!r}] must have a first (batch) dimension")
        schema[k] = (a.dtype, a.shape[1:])
    return schema


def check_required(keys: Iterable[str]) -> None:
    """``ValueError`` naming the :data:`REQUIRED_KEYS` missing from ``keys``."""
    keys = set(keys)
    missing = [k for k in REQUIRED_KEYS if k not in keys]
    if missing:
        raise ValueError(f"batch lacks required key(s) {missing}; it has {sorted(keys)}")


class ItemStorage:
    """``capacity`` slots of items with a fixed :data:`Schema`.

    Keys of at most :data:`PACK_BYTES` per item share one record array, so a
    gathered item costs a cache line or two, not one per key; larger keys
    (images) get an array of their own.
    """

    def __init__(self, capacity: int, schema: Schema) -> None:
        self.capacity = int(capacity)
        self.schema = dict(schema)
        self.keys = frozenset(schema)
        small = [
            (k, dtype, shape)
            for k, (dtype, shape) in schema.items()
            if dtype.itemsize * math.prod(shape) <= PACK_BYTES and not dtype.hasobject
        ]
        self.records = np.empty(capacity, np.dtype(small, align=True)) if small else None
        self.packed = tuple(k for k, _, _ in small)
        self.arrays: dict[str, np.ndarray] = {
            k: self.records[k] if k in self.packed else np.empty((capacity, *shape), dtype)
            for k, (dtype, shape) in schema.items()
        }

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays allocated."""
        own = sum(v.nbytes for k, v in self.arrays.items() if k not in self.packed)
        return own + (0 if self.records is None else self.records.nbytes)

    def check(self, batch: Mapping[str, np.ndarray]) -> tuple[int, Mapping[str, np.ndarray]]:
        """Number of items in ``batch`` and its arrays, or ``ValueError`` naming a bad key."""
        if batch.keys() != self.keys:
            extra = sorted(set(batch) - self.keys)
            missing = sorted(self.keys - set(batch))
            key = (missing or extra)[0]
            raise ValueError(
                f"batch key {key!r} does not match the schema (missing {missing}, extra {extra})"
            )
        schema = self.schema
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

    def write(self, pos: int, arrays: Mapping[str, np.ndarray], n: int) -> None:
        """Items ``0..n-1`` to slots ``(pos + i) % capacity``; only the last ``capacity`` stay."""
        cap = self.capacity
        if pos + n <= cap:  # the common case: one slice per key
            for k, a in arrays.items():
                self.arrays[k][pos : pos + n] = a
            return
        skip = max(0, n - cap)
        start = (pos + skip) % cap
        n1 = min(n - skip, cap - start)
        for k, a in arrays.items():
            dst = self.arrays[k]
            dst[start : start + n1] = a[skip : skip + n1]
            dst[: n - skip - n1] = a[skip + n1 :]

    def gather(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """The items at ``indices``, one array per key (in schema order)."""
        records = None if self.records is None else self.records.take(indices)
        return {
            k: np.ascontiguousarray(records[k]) if k in self.packed else v.take(indices, axis=0)
            for k, v in self.arrays.items()
        }

    def export(self, count: int) -> dict[str, np.ndarray]:
        """Copies of slots ``0..count-1``, per key."""
        return {k: v[:count].copy() for k, v in self.arrays.items()}

    def load(self, data: Mapping[str, np.ndarray], count: int) -> None:
        """Fill slots ``0..count-1`` from :meth:`export`'s arrays."""
        for k, v in data.items():
            self.arrays[k][:count] = v
