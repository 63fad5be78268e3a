"""Bounded time series of Ape-X metrics, kept on the scheduler.

Pure Python (no Dask, no Bokeh): the scheduler plugin feeds it with the
event-log messages of ``docs/metrics.md``, and the dashboard page, the JSON
route and the Prometheus collector read it.

Memory stays bounded for a run of any length: each metric keeps at most
``maxlen`` points. Points start one per ``resolution_s`` bucket (the last
value in a bucket wins, with the time of that last value); when a series
reaches ``maxlen`` points, its bucket width doubles and points falling into
the same wider bucket merge (last value wins). With the defaults
(3600 points, 1 s) a 1-hour run is kept at full resolution, a 10-hour run at
16 s resolution, still spanning the whole run.

A message with a new ``run`` id resets every series; the previous run's
latest values are kept (``previous``). Messages of a run that was replaced
are ignored, so a straggler from an old actor cannot flip the page back.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any

Point = tuple[float, float]


class _Series:
    """Points ``(t, v)`` with increasing ``t``, at most ``maxlen`` of them."""

    __slots__ = ("maxlen", "width", "t", "v")

    def __init__(self, maxlen: int, width: float) -> None:
        self.maxlen = maxlen
        self.width = width
        self.t: list[float] = []
        self.v: list[float] = []

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

    def _coarsen(self) -> None:
        """Double the bucket width until the series is at most half full."""
        while len(self.t) > self.maxlen // 2:
            self.width *= 2.0
            ts: list[float] = []
            vs: list[float] = []
            for t, v in zip(self.t, self.v, strict=True):
                if ts and math.floor(t / self.width) == math.floor(ts[-1] / self.width):
                    ts[-1], vs[-1] = t, v
                else:
                    ts.append(t)
                    vs.append(v)
            self.t, self.v = ts, vs

    def since(self, t0: float) -> list[Point]:
        """Points with ``t > t0``, oldest first."""
        i = len(self.t)
        while i > 0 and self.t[i - 1] > t0:
            i -= 1
        return list(zip(self.t[i:], self.v[i:], strict=True))


class MetricsStore:
    """Latest value and a bounded time series per metric name, for one run.

    ``ingest(msg)`` takes one transport message
    ``{"run", "source", "time", "metrics": {name: float}}`` and stamps its
    points with the receive time ``now`` (the scheduler's clock, one clock for
    all sources). ``generation`` increases on every reset so readers
    (dashboard components) know to drop what they streamed before.
    """

    def __init__(
        self,
        maxlen: int = 3600,
        resolution_s: float = 1.0,
        max_names: int = 20_000,
        retired_runs: int = 64,
    ) -> None:
        if maxlen < 4:
            raise ValueError("maxlen must be at least 4")
        self.maxlen = maxlen
        self.resolution_s = resolution_s
        self.max_names = max_names
        self._lock = threading.RLock()
        self._retired: deque[str] = deque(maxlen=retired_runs)
        self.run: str | None = None
        self.generation = 0
        self.started: float | None = None
        self.updated: float | None = None
        self.messages = 0
        self.dropped_names = 0
        self.latest: dict[str, float] = {}
        self.sources: dict[str, float] = {}
        self.previous: dict[str, Any] | None = None
        self._series: dict[str, _Series] = {}

    # -- writing -------------------------------------------------------------
    def reset(self, run: str | None) -> None:
        """Start a new run: clear series and latest values."""
        with self._lock:
            if self.run is not None:
                self.previous = {"run": self.run, "latest": self.latest}
                self._retired.append(self.run)
            self.run = run
            self.generation += 1
            self.started = None
            self.updated = None
            self.latest = {}
            self.sources = {}
            self._series = {}

    def ingest(self, msg: Mapping[str, Any], now: float | None = None) -> bool:
        """Add one message; return False if it was ignored (malformed or old run)."""
        try:
            run = str(msg["run"])
            metrics = msg["metrics"]
            source = str(msg.get("source", "?"))
        except (KeyError, TypeError):
            return False
        if not isinstance(metrics, Mapping):
            return False
        now = time.time() if now is None else float(now)
        with self._lock:
            if run != self.run:
                if run in self._retired:
                    return False
                self.reset(run)
            if self.started is None:
                self.started = now
            self.updated = now
            self.messages += 1
            self.sources[source] = now
            for name, value in metrics.items():
                try:
                    v = float(value)
                except (TypeError, ValueError):
                    continue
                name = str(name)
                series = self._series.get(name)
                if series is None:
                    if len(self._series) >= self.max_names:
                        self.dropped_names += 1
                        continue
                    series = self._series[name] = _Series(self.maxlen, self.resolution_s)
                series.add(now, v)
                self.latest[name] = v
            return True

    # -- reading -------------------------------------------------------------
    def names(self) -> list[str]:
        """Metric names of the current run, sorted."""
        with self._lock:
            return sorted(self._series)

    def since(self, name: str, t0: float = -math.inf) -> list[Point]:
        """Points ``(t, v)`` of ``name`` with ``t > t0`` (unix seconds), oldest first."""
        with self._lock:
            series = self._series.get(name)
            return series.since(t0) if series is not None else []

    def snapshot(self) -> tuple[str | None, int, dict[str, float]]:
        """``(run, generation, latest values)``, consistent with each other."""
        with self._lock:
            return self.run, self.generation, dict(self.latest)

    def to_json(
        self,
        names: Iterable[str] | None = None,
        since: float = -math.inf,
        series: bool = True,
    ) -> dict[str, Any]:
        """The ``/apex/metrics.json`` document.

        ``{"run", "generation", "started", "updated", "sources": {source: t},
        "latest": {name: v}, "series": {name: [[t, v], ...]}, "previous"}``;
        ``names`` are shell-style patterns (``replay/*/size``); NaN and
        infinities become ``null``.
        """
        patterns = [p for p in (names or []) if p]
        with self._lock:
            selected = [n for n in sorted(self._series) if _match(n, patterns)]
            doc: dict[str, Any] = {
                "run": self.run,
                "generation": self.generation,
                "started": self.started,
                "updated": self.updated,
                "sources": dict(self.sources),
                "latest": {n: _finite(self.latest[n]) for n in selected if n in self.latest},
            }
            if series:
                doc["series"] = {
                    n: [[t, _finite(v)] for t, v in self._series[n].since(since)] for n in selected
                }
            if self.previous is not None:
                doc["previous"] = {
                    "run": self.previous["run"],
                    "latest": {
                        n: _finite(v)
                        for n, v in self.previous["latest"].items()
                        if _match(n, patterns)
                    },
                }
            return doc


def _match(name: str, patterns: list[str]) -> bool:
    return not patterns or any(fnmatchcase(name, p) for p in patterns)


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None
