"""Reading a :class:`~.metrics_store.MetricsStore`: one run of it (or whichever is newest).

::

    view = RunView(store)          # the newest run, whichever that is
    view.select("run-2")           # that run from now on
"""

from __future__ import annotations

import math
from typing import Any

from apex_dask.runtime.observability.metrics_series import Point
from apex_dask.runtime.observability.metrics_store import MetricsStore

__all__ = ["RunView"]


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
