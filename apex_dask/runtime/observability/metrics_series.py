"""One metric's bounded time series, as the scheduler's metrics store keeps it.

Points ``(t, v)`` sit in two ``array('d')`` (16 bytes a point). Points start
one per ``width`` seconds (the last value in a bucket wins, with the time of
that last value); when the series reaches ``maxlen`` points its bucket width
doubles and points falling into the same wider bucket merge (last value
wins), until at most half of ``maxlen`` are left. So a series never holds
more than ``maxlen`` points and still spans the whole run. ``maxlen`` may be
lowered later (:meth:`Series.resize`): the store shares one point budget among
all its series.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right

import numpy as np

Point = tuple[float, float]

__all__ = ["BYTES_PER_POINT", "Point", "Series"]

BYTES_PER_POINT = 16
"""Memory of one point: its time and value as float64."""


class Series:
    """Points ``(t, v)`` with increasing ``t``, at most ``maxlen`` of them."""

    __slots__ = ("maxlen", "width", "t", "v")

    def __init__(self, maxlen: int, width: float) -> None:
        self.maxlen = maxlen
        self.width = width
        self.t = array("d")
        self.v = array("d")

    def __len__(self) -> int:
        return len(self.t)

    def add(self, t: float, v: float) -> None:
        if self.t and t < self.t[-1]:
            t = self.t[-1]  # keep times monotone when clocks jitter
        if self.t and math.floor(t / self.width) == math.floor(self.t[-1] / self.width):
            self.t[-1] = t
            self.v[-1] = v
            return
        self.t.append(t)
        self.v.append(v)
        if len(self.t) >= self.maxlen:
            self._coarsen()

    def resize(self, maxlen: int) -> None:
        """Hold at most ``maxlen`` points from now on (coarsening now if needed)."""
        self.maxlen = maxlen
        if len(self.t) >= maxlen:
            self._coarsen()

    def _coarsen(self) -> None:
        """Double the bucket width until the series is at most half full (vectorized: the
        store may coarsen every series at once, on the scheduler's event loop)."""
        t = np.frombuffer(self.t, dtype=np.float64)
        v = np.frombuffer(self.v, dtype=np.float64)
        while len(t) > self.maxlen // 2:
            self.width *= 2.0
            bucket = np.floor(t / self.width)
            last = np.append(bucket[1:] != bucket[:-1], True)  # the last point of each bucket
            t, v = t[last], v[last]
        self.t, self.v = array("d", t.tobytes()), array("d", v.tobytes())

    def tail(self, t0: float) -> tuple[array, array]:
        """Copies of the times and values with ``t > t0`` (a memory copy: fast under a lock)."""
        i = bisect_right(self.t, t0)  # the first point after t0 (times increase)
        return self.t[i:], self.v[i:]

    def since(self, t0: float) -> list[Point]:
        """Points with ``t > t0``, oldest first."""
        ts, vs = self.tail(t0)
        return list(zip(ts, vs, strict=True))
