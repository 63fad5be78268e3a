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

Runs are kept side by side, by run id (several runs may share one
scheduler); a bounded number of them, finished runs going first
(:class:`MetricsStore`).
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


class RunMetrics:
    """One run's latest values and bounded series, who reported, its folder, whether done."""

    def __init__(self, run: str, maxlen: int, resolution_s: float, max_names: int) -> None:
        self.run = run
        self.maxlen = maxlen
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
        self._series: dict[str, _Series] = {}

    def add(self, msg: Mapping[str, Any], metrics: Mapping[str, Any], now: float) -> None:
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
                if len(self._series) >= self.max_names:
                    self.dropped_names += 1
                    continue
                series = self._series[name] = _Series(self.maxlen, self.resolution_s)
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
    ) -> None:
        if maxlen < 4:
            raise ValueError("maxlen must be at least 4")
        if max_runs < 1:
            raise ValueError("max_runs must be at least 1")
        self.maxlen = maxlen
        self.resolution_s = resolution_s
        self.max_names = max_names
        self.max_runs = max_runs
        self._lock = threading.RLock()
        self._dropped: deque[str] = deque(maxlen=dropped_runs)
        self._runs: dict[str, RunMetrics] = {}  # oldest first
        self.generation = 0

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
                data = self._runs[run] = RunMetrics(
                    run, self.maxlen, self.resolution_s, self.max_names
                )
                self.generation += 1
                self._bound()
            data.add(msg, metrics, now)
            return True

    def set_animation(self, msg: Mapping[str, Any]) -> bool:
        """Keep the evaluator's newest animation of a kept run (``gif`` bytes and what it
        shows: ``time``, ``return``, ``length``, ``weights_version``); False if ignored."""
        run, gif = msg.get("run"), msg.get("gif")
        if not isinstance(gif, bytes | bytearray) or not gif:
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
            victim = done[0] if done else min(older, key=lambda r: r.updated or -math.inf)
            del self._runs[victim.run]
            self._dropped.append(victim.run)

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

    def view(self, run: str | None = None) -> RunView:
        """A reader of ``run`` (None: whichever run is the newest)."""
        return RunView(self, run)

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
        {source: t}, "latest": {name: v}, "series": {name: [[t, v], ...]},
        "runs": [summary, ...]}``; ``names`` are shell-style patterns
        (``replay/*/size``); NaN and infinities become ``null``. KeyError for a
        ``run`` that is not kept.
        """
        patterns = [p for p in (names or []) if p]
        with self._lock:
            data = self.get(run)
            if data is None and run is not None:
                raise KeyError(run)
            data = data or RunMetrics("", self.maxlen, self.resolution_s, self.max_names)
            selected = [n for n in sorted(data._series) if _match(n, patterns)]
            doc: dict[str, Any] = {
                "run": data.run or None,
                "out": data.out,
                "done": data.done,
                "generation": self.generation,
                "started": data.started,
                "updated": data.updated,
                "sources": dict(data.sources),
                "latest": {n: _finite(data.latest[n]) for n in selected if n in data.latest},
            }
            if data.animation is not None:
                doc["animation"] = {k: v for k, v in data.animation.items() if k != "gif"}
            if series:
                doc["series"] = {
                    n: [[t, _finite(v)] for t, v in data._series[n].since(since)] for n in selected
                }
            doc["runs"] = self.runs()
            return doc


class RunView:
    """Reads one run of a store (or whichever is the newest, ``run=None``) with the
    store's reading methods; ``generation`` changes when the run it shows changes."""

    def __init__(self, store: MetricsStore, run: str | None = None) -> None:
        self.store = store
        self.selected = run
        self._shown: str | None = None
        self._generation = 0

    def select(self, run: str | None) -> None:
        """Show ``run`` from now on (None or a run no longer kept: the newest)."""
        self.selected = run or None

    def _run(self) -> str | None:
        if self.selected is not None and self.store.get(self.selected) is not None:
            return self.selected
        return self.store.run

    @property
    def run(self) -> str | None:
        return self._run()

    @property
    def generation(self) -> int:
        shown = self._run()
        if shown != self._shown:
            self._shown = shown
            self._generation += 1
        return self._generation

    def _data_attr(self, name: str, default: Any) -> Any:
        return self.store._attr(name, default, self._run())

    started = property(lambda self: self._data_attr("started", None))
    updated = property(lambda self: self._data_attr("updated", None))
    messages = property(lambda self: self._data_attr("messages", 0))
    latest = property(lambda self: self._data_attr("latest", {}))
    sources = property(lambda self: self._data_attr("sources", {}))
    out = property(lambda self: self._data_attr("out", None))
    done = property(lambda self: self._data_attr("done", False))
    animation = property(lambda self: self._data_attr("animation", None))

    def runs(self) -> list[dict[str, Any]]:
        return self.store.runs()

    def names(self) -> list[str]:
        return self.store.names(self._run())

    def since(self, name: str, t0: float = -math.inf) -> list[Point]:
        return self.store.since(name, t0, self._run())

    def snapshot(self) -> tuple[str | None, int, dict[str, float]]:
        run, _, latest = self.store.snapshot(self._run())
        return run, self.generation, latest


def _match(name: str, patterns: list[str]) -> bool:
    return not patterns or any(fnmatchcase(name, p) for p in patterns)


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None
