"""Windowed timers and statistics, in the shapes Ape-X learners report.

``Timer`` measures how long a block takes and keeps the last ``window``
durations::

    grad_timer = Timer()
    with grad_timer:
        learner.update(batch, weights)
    grad_timer.mean             # mean seconds per block over the window
    grad_timer.total_s          # seconds of every block ever timed

``WindowStat`` keeps the last ``n`` values of a quantity (e.g. the learner's
inqueue size) and summarises them as count / mean / std / quantiles.
"""

from __future__ import annotations

import math
import time
from collections import deque
from types import TracebackType

import numpy as np

__all__ = ["Timer", "WindowStat", "QUANTILES"]

QUANTILES: tuple[int, ...] = (0, 10, 50, 90, 100)
"""Percentiles reported by :meth:`WindowStat.stats`, in order."""


class Timer:
    """Context-manager stopwatch with a sliding window of the last ``window`` timings.

    ``mean`` = (1/k) * sum of the last k <= window durations (seconds; NaN before
    the first one). ``count`` = timings ever
    recorded; ``total_s`` = their total duration.
    """

    def __init__(self, window: int = 100) -> None:
        if int(window) < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self.window = int(window)
        self._samples: deque[float] = deque(maxlen=self.window)
        self._start: float | None = None
        self.count = 0
        self.total_s = 0.0

    def __enter__(self) -> Timer:
        if self._start is not None:
            raise RuntimeError("Timer is already running (not re-entrant)")
        self._start = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._start is not None
        elapsed = time.perf_counter() - self._start
        self._start = None
        self.push(elapsed)

    def push(self, seconds: float) -> None:
        """Record one duration measured elsewhere."""
        self._samples.append(float(seconds))
        self.count += 1
        self.total_s += float(seconds)

    @property
    def mean(self) -> float:
        """Mean seconds per timed block over the window (NaN if none)."""
        return float(np.mean(self._samples)) if self._samples else math.nan


class WindowStat:
    """The last ``n`` values of a quantity, summarised.

    ``stats()`` returns ``{"count": values ever pushed, "mean", "std",
    "quantiles": [q0, q10, q50, q90, q100]}`` over the window (population std;
    NaN everywhere while empty). The quantiles are numpy's linear-interpolation
    percentiles.
    """

    def __init__(self, name: str, n: int = 50) -> None:
        if int(n) < 1:
            raise ValueError(f"n must be >= 1, got {n!r}")
        self.name = name
        self.n = int(n)
        self._items: deque[float] = deque(maxlen=self.n)
        self.count = 0

    def push(self, x: float) -> None:
        """Add one value (the oldest falls out once ``n`` are held)."""
        self._items.append(float(x))
        self.count += 1

    def stats(self) -> dict[str, float | int | list[float]]:
        """``{"count", "mean", "std", "quantiles"}`` over the window."""
        if not self._items:
            nan = math.nan
            return {"count": self.count, "mean": nan, "std": nan, "quantiles": [nan] * 5}
        arr = np.fromiter(self._items, dtype=np.float64, count=len(self._items))
        return {
            "count": self.count,
            "mean": float(arr.mean()),
            "std": float(arr.std()),
            "quantiles": [float(q) for q in np.percentile(arr, QUANTILES)],
        }
