"""Bounded time series of Ape-X metrics, kept on the scheduler.

Pure Python (no Dask, no Bokeh): the scheduler plugin feeds it with the
event-log messages of ``docs/metrics.md``, and the dashboard page, the JSON
route and the Prometheus collector read it.

Memory stays bounded whatever runs send: at most ``max_points`` points in all
(series x points, 16 bytes a point: the default 2,000,000 is about 32 MB).
Each series keeps up to ``maxlen`` points (:mod:`.metrics_series`: one per
``resolution_s`` bucket, then coarser, so it still spans the whole run; with
the defaults, 3600 points and 1 s, a 1-hour run is kept at full resolution, a
10-hour run at 16 s). When that many points per series would pass the budget
for the number of series kept, every series gets half as many (down to a
sixteenth of ``maxlen``); past that, a finished run is dropped to make room,
else the new series is not kept (counted in ``dropped_names``).

Runs are kept side by side, by run id (several runs may share one
scheduler); a bounded number of them, finished runs going first
(:class:`MetricsStore`).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from fnmatch import translate
from typing import Any

from apex_dask.runtime.observability.agent_metrics import listing
from apex_dask.runtime.observability.metrics_series import BYTES_PER_POINT, Point, Series

DEFAULT_MAX_POINTS = 2_000_000
"""Points the store keeps in all (series x points), unless told otherwise."""
MAX_NAME_CHARS = 200
"""Longer metric names are not kept."""
MAX_ANIMATION_BYTES = 4 << 20
"""A larger evaluation GIF is not kept."""


class RunMetrics:
    """One run's latest values and bounded series, who reported, its folder, whether done."""

    def __init__(self, run: str, resolution_s: float, max_names: int) -> None:
        self.run = run
        self.resolution_s = resolution_s
        self.max_names = max_names
        self.started: float | None = None
        self.updated: float | None = None
        self.messages = 0
        self.dropped_names = 0
        self.out: str | None = None
        self.done = False
        self.animation: dict[str, Any] | None = None
        self.latest: dict[str, float] = {}
        self.sources: dict[str, float] = {}
        self._series: dict[str, Series] = {}

    def add(
        self,
        msg: Mapping[str, Any],
        metrics: Mapping[str, Any],
        now: float,
        admit: Callable[[RunMetrics], int | None],
    ) -> None:
        """Record one message; ``admit(self)`` gives a new series its length, or None
        when the store has no room for it."""
        if self.started is None:
            self.started = now
        self.updated = now
        self.messages += 1
        self.sources[str(msg.get("source", "?"))] = now
        if msg.get("out"):
            self.out = str(msg["out"])
        if msg.get("done"):
            self.done = True
        for name, value in metrics.items():
            try:
                v = float(value)
            except (TypeError, ValueError):
                continue
            name = str(name)
            series = self._series.get(name)
            if series is None:
                room = None
                if len(self._series) < self.max_names and len(name) <= MAX_NAME_CHARS:
                    room = admit(self)
                if room is None:
                    self.dropped_names += 1
                    continue
                series = self._series[name] = Series(room, self.resolution_s)
            series.add(now, v)
            self.latest[name] = v

    def summary(self) -> dict[str, Any]:
        """``{"run", "out", "done", "started", "updated", "messages"}``."""
        return {
            "run": self.run,
            "out": self.out,
            "done": self.done,
            "started": self.started,
            "updated": self.updated,
            "messages": self.messages,
        }


class MetricsStore:
    """Latest values and bounded time series per metric name, for every run it hears of.

    ``ingest(msg)`` takes one transport message ``{"run", "source", "time",
    "metrics": {name: float}}`` (optionally ``"out"``: the run's output folder,
    ``"done": true``: the run ended) and stamps its points with the receive
    time ``now`` (the scheduler's clock, one clock for all sources). Runs are
    kept side by side: several runs on one scheduler each keep their series.
    At most ``max_runs`` are kept: a new run beyond that drops the oldest
    finished run (else the one silent longest); messages of a dropped run are
    ignored from then on, so a straggler cannot bring it back.

    Reading without ``run=`` reads the newest run (the last one to send its
    first message); ``generation`` increases whenever that changes, so
    readers (dashboard components) know to drop what they streamed before.
    :meth:`view` gives a reader of one chosen run with the same methods.
    """

    def __init__(
        self,
        maxlen: int = 3600,
        resolution_s: float = 1.0,
        max_names: int = 20_000,
        max_runs: int = 8,
        dropped_runs: int = 64,
        max_points: int = DEFAULT_MAX_POINTS,
    ) -> None:
        if maxlen < 4:
            raise ValueError("maxlen must be at least 4")
        if max_runs < 1:
            raise ValueError("max_runs must be at least 1")
        if max_points < maxlen:
            raise ValueError(f"max_points ({max_points}) must be at least maxlen ({maxlen})")
        self.maxlen = maxlen
        self.resolution_s = resolution_s
        self.max_names = max_names
        self.max_runs = max_runs
        self.max_points = int(max_points)
        self.min_points = max(4, maxlen // 16)
        self.capacity = maxlen  # points each series may hold now
        self.n_series = 0  # in all kept runs
        self._lock = threading.RLock()
        self._dropped: deque[str] = deque(maxlen=dropped_runs)
        self._runs: dict[str, RunMetrics] = {}  # oldest first
        self.generation = 0

    @property
    def memory_bound_bytes(self) -> int:
        """What the points may take at most (series x points x 16 bytes)."""
        return self.max_points * BYTES_PER_POINT

    def points_held(self) -> int:
        """Points held now, in all series of all kept runs."""
        with self._lock:
            return sum(len(x) for r in self._runs.values() for x in r._series.values())

    # -- writing -------------------------------------------------------------
    def ingest(self, msg: Mapping[str, Any], now: float | None = None) -> bool:
        """Add one message; return False if it was ignored (malformed or dropped run)."""
        try:
            run = str(msg["run"])
            metrics = msg["metrics"]
        except (KeyError, TypeError):
            return False
        if not isinstance(metrics, Mapping):
            return False
        now = time.time() if now is None else float(now)
        with self._lock:
            data = self._runs.get(run)
            if data is None:
                if run in self._dropped:
                    return False
                data = self._runs[run] = RunMetrics(run, self.resolution_s, self.max_names)
                self.generation += 1
                self._bound()
            data.add(msg, metrics, now, self._admit)
            return True

    def set_animation(self, msg: Mapping[str, Any]) -> bool:
        """Keep the evaluator's newest animation of a kept run (``gif`` bytes and what it
        shows: ``time``, ``return``, ``length``, ``weights_version``); False if ignored."""
        run, gif = msg.get("run"), msg.get("gif")
        if not isinstance(gif, bytes | bytearray) or not 0 < len(gif) <= MAX_ANIMATION_BYTES:
            return False
        with self._lock:
            data = self._runs.get(str(run))
            if data is None:
                return False
            data.animation = {
                "gif": bytes(gif),
                "time": float(msg.get("time") or time.time()),
                "return": _finite(float(msg.get("return", math.nan))),
                "length": int(msg.get("length") or 0),
                "weights_version": int(msg.get("weights_version") or 0),
            }
            return True

    def _bound(self) -> None:
        while len(self._runs) > self.max_runs:
            older = list(self._runs.values())[:-1]  # never the run just added
            done = [r for r in older if r.done]
            self._drop(done[0] if done else min(older, key=lambda r: r.updated or -math.inf))

    def _drop(self, victim: RunMetrics) -> None:
        del self._runs[victim.run]
        self._dropped.append(victim.run)
        self.n_series -= len(victim._series)
        capacity = self.capacity  # room again: series may grow back to maxlen
        while capacity * 2 <= self.maxlen and self.n_series * capacity * 2 <= self.max_points:
            capacity *= 2
        self._resize(capacity)

    def _resize(self, capacity: int) -> None:
        if capacity != self.capacity:
            self.capacity = capacity
            for data in self._runs.values():
                for series in data._series.values():
                    series.resize(capacity)

    def _admit(self, data: RunMetrics) -> int | None:
        """Room for one more series of ``data`` within ``max_points``: its length, or None."""
        n = self.n_series + 1
        capacity = self.capacity
        while n * capacity > self.max_points and capacity // 2 >= self.min_points:
            capacity //= 2
        if n * capacity > self.max_points:
            done = [r for r in self._runs.values() if r.done and r is not data]
            if not done:
                return None
            self._drop(done[0])
            return self._admit(data)
        self._resize(capacity)
        self.n_series = n
        return capacity

    # -- reading -------------------------------------------------------------
    def get(self, run: str | None = None) -> RunMetrics | None:
        """Run ``run`` (None: the newest), or None if it is not kept."""
        with self._lock:
            if run is None:
                return next(reversed(self._runs.values()), None)
            return self._runs.get(run)

    def runs(self) -> list[dict[str, Any]]:
        """Every kept run's :meth:`RunMetrics.summary`, newest first."""
        with self._lock:
            return [r.summary() for r in reversed(self._runs.values())]

    @property
    def run(self) -> str | None:
        """The newest run's id (None before any message)."""
        data = self.get()
        return None if data is None else data.run

    def _attr(self, name: str, default: Any, run: str | None = None) -> Any:
        data = self.get(run)
        return default if data is None else getattr(data, name)

    started = property(lambda self: self._attr("started", None))
    updated = property(lambda self: self._attr("updated", None))
    messages = property(lambda self: self._attr("messages", 0))
    dropped_names = property(lambda self: self._attr("dropped_names", 0))
    latest = property(lambda self: self._attr("latest", {}))
    sources = property(lambda self: self._attr("sources", {}))
    out = property(lambda self: self._attr("out", None))
    done = property(lambda self: self._attr("done", False))

    def names(self, run: str | None = None) -> list[str]:
        """Metric names of a run (default the newest), sorted."""
        with self._lock:
            return sorted(self._attr("_series", {}, run))

    def since(self, name: str, t0: float = -math.inf, run: str | None = None) -> list[Point]:
        """Points ``(t, v)`` of ``name`` with ``t > t0`` (unix seconds), oldest first."""
        with self._lock:
            series = self._attr("_series", {}, run).get(name)
            return series.since(t0) if series is not None else []

    def snapshot(self, run: str | None = None) -> tuple[str | None, int, dict[str, float]]:
        """``(run, generation, latest values)``, consistent with each other."""
        with self._lock:
            data = self.get(run)
            if data is None:
                return None, self.generation, {}
            return data.run, self.generation, dict(data.latest)

    def to_json(
        self,
        names: Iterable[str] | None = None,
        since: float = -math.inf,
        series: bool = True,
        run: str | None = None,
    ) -> dict[str, Any]:
        """The ``/apex/metrics.json`` document of ``run`` (default the newest).

        ``{"run", "out", "done", "generation", "started", "updated", "sources":
        {source: t}, "agent_metrics": {name: {"agents", "meaning"}}, "latest": {name: v},
        "series": {name: [[t, v], ...]}, "runs": [summary, ...]}``; ``names`` are shell-style patterns
        (``replay/*/size``); NaN and infinities become ``null``. KeyError for a
        ``run`` that is not kept. Safe to call from another thread: the lock is
        held only to copy the run's summary, then one series at a time, so the
        writers (the scheduler's event loop) never wait long.
        """
        doc, selected, data = self._head(names, run)
        if series:
            doc["series"] = dict(self.series_items(data, selected, since))
        return doc

    def _head(
        self, names: Iterable[str] | None, run: str | None
    ) -> tuple[dict[str, Any], list[str], RunMetrics]:
        """The document without its series, the selected names, and the run's data."""
        keep = name_filter(names or [])
        with self._lock:
            data = self.get(run)
            if data is None and run is not None:
                raise KeyError(run)
            data = data or RunMetrics("", self.resolution_s, self.max_names)
            doc: dict[str, Any] = {
                "run": data.run or None,
                "out": data.out,
                "done": data.done,
                "generation": self.generation,
                "started": data.started,
                "updated": data.updated,
                "sources": dict(data.sources),
                "agent_metrics": listing(),  # what each agent adds, from its declaration
            }
            latest = dict(data.latest)
            every = list(data._series)
            if data.animation is not None:
                doc["animation"] = {k: v for k, v in data.animation.items() if k != "gif"}
            doc["runs"] = self.runs()
        selected = sorted(n for n in every if keep(n))
        doc["latest"] = {n: _finite(latest[n]) for n in selected if n in latest}
        return doc, selected, data

    def series_items(
        self, data: RunMetrics, names: list[str], since: float
    ) -> Iterator[tuple[str, list[list[float | None]]]]:
        """``(name, [[t, v], ...])`` of ``data``'s series ``names``, each copied under the
        lock on its own."""
        for n in names:
            with self._lock:
                s = data._series.get(n)
                if s is None:
                    continue
                ts, vs = s.tail(since)
            yield n, [[t, _finite(v)] for t, v in zip(ts, vs, strict=True)]

    def json_chunks(
        self,
        names: Iterable[str] | None = None,
        since: float = -math.inf,
        series: bool = True,
        run: str | None = None,
    ) -> list[bytes]:
        """:meth:`to_json` as UTF-8 JSON in pieces (``b"".join`` them for the whole), one per series, made without a Python
        object per point (no work for the garbage collector, which would stop every
        thread): from a thread, the interpreter can hand the event loop its turn
        between any two series, and the pieces can be sent as they are."""
        doc, selected, data = self._head(names, run)
        head = json.dumps(doc, allow_nan=False)
        if not series:
            return [head.encode()]
        chunks = [f'{head[:-1]}, "series": {{'.encode()]
        for n in selected:
            with self._lock:
                s = data._series.get(n)
                if s is None:
                    continue
                ts, vs = s.tail(since)
            points = ", ".join(
                f"[{t!r}, {v!r}]" if math.isfinite(v) else f"[{t!r}, null]"
                for t, v in zip(ts, vs, strict=True)
            )
            chunks.append(f"{', ' if len(chunks) > 1 else ''}{json.dumps(n)}: [{points}]".encode())
            time.sleep(0)  # offer the GIL: the event loop waits well under a switch interval
        chunks.append(b"}}")
        return chunks


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def name_filter(patterns: Iterable[str]) -> Callable[[str], bool]:
    """Whether a metric name matches any of the shell-style ``patterns`` (``replay/*/size``;
    none: every name), as one compiled expression: one match per name, however many
    patterns."""
    wanted = [p for p in patterns if p]
    if not wanted:
        return lambda name: True
    match = re.compile("|".join(f"(?:{translate(p)})" for p in wanted)).match
    return lambda name: match(name) is not None
