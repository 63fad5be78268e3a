"""The Ape-X page (``/apex``) on the scheduler's Bokeh dashboard.

Every plot is a ``DashboardComponent`` reading a :class:`.metrics_store.MetricsStore`:
``update()`` streams the points that arrived since the last call into its
``ColumnDataSource`` (``time`` in ms since the epoch, ``value``), cleared
when a new run starts. The page calls ``update()`` once a second.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bokeh.layouts import column, gridplot, row
from bokeh.models import ColumnDataSource, DataRange1d, LinearAxis
from bokeh.palettes import Category10_10
from bokeh.plotting import figure
from distributed.dashboard.components import DashboardComponent, add_periodic_callback

from apex_dask.runtime.observability.agent_metrics import charted
from apex_dask.runtime.observability.dashboard_header import (
    EMPTY_TEXT,
    EvalAnimation,
    HealthStrip,
    RunSelector,
    RunStatus,
)
from apex_dask.runtime.observability.metrics import get_plugin
from apex_dask.runtime.observability.metrics_store import MetricsStore
from apex_dask.runtime.observability.metrics_view import RunView

__all__ = [
    "EMPTY_TEXT",
    "ApexDashboard",
    "EvalAnimation",
    "HealthStrip",
    "Line",
    "QueueSizeFigure",
    "ReplaySizeFigure",
    "RunSelector",
    "RunStatus",
    "TimeSeriesFigure",
    "apex_doc",
]

if TYPE_CHECKING:
    from bokeh.document import Document
    from distributed import Scheduler

ROLLOVER = 3600
TOOLS = "pan,xwheel_zoom,box_zoom,reset,save"


@dataclass(frozen=True)
class Line:
    """One metric drawn as a line: ``value = scale * metric``."""

    name: str
    label: str
    color: str
    scale: float = 1.0
    right: bool = False  # on the secondary y axis


def _empty() -> dict[str, list[float]]:
    return {"time": [], "value": []}


def _figure(title: str, y_label: str, x_range: DataRange1d | None, **kwargs: Any) -> Any:
    kwargs.setdefault("height", 240)
    kwargs.setdefault("sizing_mode", "stretch_width")
    fig = figure(
        title=title,
        x_axis_type="datetime",
        x_range=x_range if x_range is not None else DataRange1d(),
        tools=TOOLS,
        toolbar_location="above",
        **kwargs,
    )
    fig.yaxis[0].axis_label = y_label
    return fig


class _Cursor:
    """Remembers, per metric, the time of the last point handed out."""

    def __init__(self, store: MetricsStore) -> None:
        self.store = store
        self.generation = -1
        self.last: dict[str, float] = {}

    def new_run(self) -> bool:
        """True (once) when the store started a new run since the last call."""
        if self.store.generation != self.generation:
            self.generation = self.store.generation
            self.last = {}
            return True
        return False

    def pull(self, name: str) -> list[tuple[float, float]]:
        points = self.store.since(name, self.last.get(name, -math.inf))
        if points:
            self.last[name] = points[-1][0]
        return points


class TimeSeriesFigure(DashboardComponent):
    """A time plot of a few metrics, one ``ColumnDataSource`` per metric (``sources``)."""

    def __init__(
        self,
        store: MetricsStore,
        title: str,
        lines: Sequence[Line],
        y_label: str,
        right_label: str | None = None,
        x_range: DataRange1d | None = None,
        rollover: int = ROLLOVER,
        **kwargs: Any,
    ) -> None:
        self.store = store
        self.lines = list(lines)
        self.rollover = rollover
        self._cursor = _Cursor(store)
        self.sources = {line.name: ColumnDataSource(_empty()) for line in self.lines}
        self.source = self.sources[self.lines[0].name]
        self.root = _figure(title, y_label, x_range, **kwargs)
        left, right = [], []
        for line in self.lines:
            kw = {"y_range_name": "right"} if line.right else {}
            r = self.root.line(
                x="time",
                y="value",
                source=self.sources[line.name],
                color=line.color,
                line_width=2,
                legend_label=line.label,
                **kw,
            )
            (right if line.right else left).append(r)
        if right:
            self.root.y_range = DataRange1d(renderers=left)
            self.root.extra_y_ranges = {"right": DataRange1d(renderers=right)}
            self.root.add_layout(LinearAxis(y_range_name="right", axis_label=right_label), "right")
        self.root.legend.location = "top_left"
        self.root.legend.click_policy = "hide"
        self.root.legend.background_fill_alpha = 0.6

    def _on_new_run(self) -> None:
        for source in self.sources.values():
            source.data = _empty()

    def update(self) -> None:
        if self._cursor.new_run():
            self._on_new_run()
        for line in self.lines:
            points = self._cursor.pull(line.name)
            if points:
                self.sources[line.name].stream(
                    {
                        "time": [t * 1000.0 for t, _ in points],
                        "value": [v * line.scale for _, v in points],
                    },
                    rollover=self.rollover,
                )


class QueueSizeFigure(TimeSeriesFigure):
    """Learner inqueue size: mean line and the q10..q90 band (``band_source``)."""

    def __init__(self, store: MetricsStore, x_range: DataRange1d | None = None, **kw: Any):
        lines = [Line("learner/queue_size", "mean", Category10_10[0])]
        super().__init__(store, "Learner queue size", lines, "batches", x_range=x_range, **kw)
        self.band_source = ColumnDataSource({"time": [], "lower": [], "upper": []})
        band = self.root.varea(
            x="time",
            y1="lower",
            y2="upper",
            source=self.band_source,
            fill_color=Category10_10[0],
            fill_alpha=0.2,
            legend_label="q10..q90",
        )
        self.root.renderers = [band, *(r for r in self.root.renderers if r is not band)]

    def _on_new_run(self) -> None:
        super()._on_new_run()
        self.band_source.data = {"time": [], "lower": [], "upper": []}

    def update(self) -> None:
        super().update()
        lows = dict(self._cursor.pull("learner/queue_size/q10"))
        highs = self._cursor.pull("learner/queue_size/q90")
        both = [(t, lows[t], hi) for t, hi in highs if t in lows]
        if both:
            self.band_source.stream(
                {
                    "time": [t * 1000.0 for t, _, _ in both],
                    "lower": [lo for _, lo, _ in both],
                    "upper": [hi for _, _, hi in both],
                },
                rollover=self.rollover,
            )


class ReplaySizeFigure(DashboardComponent):
    """One line per shard of ``replay/<k>/<metric>`` (items by default; ``bytes``: its
    memory), added as shards appear."""

    def __init__(
        self,
        store: MetricsStore,
        x_range: DataRange1d | None = None,
        rollover: int = ROLLOVER,
        metric: str = "size",
        **kw: Any,
    ):
        self.store = store
        self.rollover = rollover
        self._cursor = _Cursor(store)
        self._pattern = re.compile(rf"^replay/(\d+)/{re.escape(metric)}$")
        self.sources: dict[int, ColumnDataSource] = {}
        unit = "items" if metric == "size" else metric
        self.root = _figure(f"Replay {metric} per shard", unit, x_range, **kw)
        self.source = ColumnDataSource(_empty())  # placeholder until a shard reports

    def _line(self, shard: int) -> ColumnDataSource:
        source = self.sources.get(shard)
        if source is None:
            source = self.sources[shard] = ColumnDataSource(_empty())
            self.root.line(
                x="time",
                y="value",
                source=source,
                color=Category10_10[shard % 10],
                line_width=2,
                legend_label=f"shard {shard}",
            )
            self.root.legend.location = "top_left"
            self.root.legend.click_policy = "hide"
            if shard == min(self.sources):
                self.source = source
        return source

    def update(self) -> None:
        if self._cursor.new_run():
            for source in self.sources.values():
                source.data = _empty()
        for name in self.store.names():
            m = self._pattern.match(name)
            if m is None:
                continue
            points = self._cursor.pull(name)
            if points:
                self._line(int(m.group(1))).stream(
                    {"time": [t * 1000.0 for t, _ in points], "value": [v for _, v in points]},
                    rollover=self.rollover,
                )


class ApexDashboard(DashboardComponent):
    """All components of the ``/apex`` page; ``root`` is the page layout.

    Given a :class:`MetricsStore`, the page reads it through its own
    :class:`~.metrics_view.RunView`, so each open page can show a different
    run (the selector, :class:`RunSelector`, shows once a second run reports).
    """

    def __init__(self, store: MetricsStore | RunView, **kw: Any) -> None:
        if isinstance(store, MetricsStore):
            store = RunView(store)
        self.store = store
        self.selector = RunSelector(store)
        kw = {**kw, "x_range": DataRange1d()}  # one time axis shared by every plot
        c = Category10_10
        self.status, self.health = RunStatus(store), HealthStrip(store)
        self.queue = QueueSizeFigure(store, **kw)
        self.timers = TimeSeriesFigure(
            store,
            "Learner timers",
            [
                Line("learner/dequeue_s", "dequeue", c[0], 1e3),
                Line("learner/grad_s", "grad", c[1], 1e3),
                Line("learner/overall_s", "overall", c[2], 1e3),
            ],
            "ms per step",
            **kw,
        )
        self.updates = TimeSeriesFigure(
            store,
            "Learner updates/s",
            [Line("learner/updates_per_s", "updates/s", c[3])],
            "updates/s",
            **kw,
        )
        self.env_steps = TimeSeriesFigure(
            store,
            "Env steps/s",
            [Line("env/steps_per_s", "env steps/s", c[4])],
            "steps/s",
            **kw,
        )
        self.replay = ReplaySizeFigure(store, **kw)
        self.replay_bytes = ReplaySizeFigure(store, metric="bytes", **kw)
        self.returns = TimeSeriesFigure(
            store,
            "Episode return",
            [
                Line("env/episode_return_mean", "lowest-epsilon third", c[0]),
                Line("eval/return_mean", "greedy eval", c[3]),
            ],
            "return",
            **kw,
        )
        self.sync = TimeSeriesFigure(
            store,
            "Weight syncs and policy lag",
            [
                Line("sync/policy_lag", "policy lag", c[1]),
                *(Line(n, label, c[3 + k]) for k, (n, label) in enumerate(charted("sync"))),
                Line("sync/weight_syncs", "weight syncs", c[7], right=True),
            ],
            "versions behind",
            right_label="syncs",
            **kw,
        )
        self.blocked = TimeSeriesFigure(
            store,
            "Producers blocked on a full learner queue",
            [Line("learner/enqueue_blocked_s", "enqueue blocked", c[3])],
            "seconds (cumulative)",
            **kw,
        )
        self.workers = TimeSeriesFigure(
            store,
            "Workers (elastic runs follow joins and retirements)",
            [
                Line("workers/env_workers", "env workers", c[2]),
                Line("workers/dask_workers", "Dask workers", c[5]),
            ],
            "count",
            **kw,
        )
        self.device = TimeSeriesFigure(  # a CUDA learner only: empty on a CPU learner
            store,
            "Learner device (CUDA)",
            [
                Line("learner/device_busy", "busy fraction", c[0]),
                Line("learner/h2d_s", "copy to device, ms", c[1], 1e3),
                Line("learner/device_mem_bytes", "memory GiB", c[2], 2**-30, right=True),
                Line("learner/device_mem_peak_bytes", "peak GiB", c[3], 2**-30, right=True),
            ],
            "busy / ms",
            right_label="GiB",
            **kw,
        )
        own = [Line(n, label, c[k % 10]) for k, (n, label) in enumerate(charted("agent"))]
        self.agent = own and TimeSeriesFigure(store, "Agent metrics", own, "value", **kw)
        names = ("queue", "timers", "updates", "env_steps", "replay", "replay_bytes", "returns")
        names += ("sync", "blocked", "workers", "device") + (("agent",) if own else ())
        self.figures = [getattr(self, name) for name in names]
        self.animation = EvalAnimation(store)
        beside = {id(self.returns): row(self.returns.root, self.animation.root)}
        cells = [beside.get(id(f), f.root) for f in self.figures]
        self.grid = gridplot(cells, ncols=2, sizing_mode="stretch_width", merge_tools=False)
        self.grid.visible = False
        header = row(self.selector.root, self.status.root, sizing_mode="stretch_width")
        self.root = column(header, self.health.root, self.grid, sizing_mode="stretch_width")
        self.source = self.queue.source

    def update(self) -> None:
        self.selector.update()
        self.status.update()
        self.health.update()
        for fig in self.figures:
            fig.update()
        self.animation.update()
        self.grid.visible = self.store.run is not None


def apex_doc(scheduler: Scheduler, extra: dict[str, Any], doc: Document) -> None:
    """Bokeh document function for ``/apex`` (``(scheduler, extra, doc)`` like Dask's pages)."""
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env

    plugin = get_plugin(scheduler)
    page = ApexDashboard(plugin.store)
    page.update()
    doc.title = "Dask: Ape-X"
    add_periodic_callback(doc, page, 1000)
    doc.add_root(page.root)
    doc.template = env.get_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME
