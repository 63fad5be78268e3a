"""Parts of the ``/apex`` page besides the plots: which run it shows, that run's status
line, and the evaluator's animation of its newest greedy episode."""

from __future__ import annotations

import html
import math
import time
from typing import Any

from bokeh.models import Div, Select
from distributed.dashboard.components import DashboardComponent

from apex_dask.runtime.observability.metrics_store import MetricsStore
from apex_dask.runtime.observability.metrics_view import RunView

__all__ = ["EMPTY_TEXT", "EvalAnimation", "HealthStrip", "RunSelector", "RunStatus"]

EMPTY_TEXT = "Waiting for an Ape-X run to report..."

_KEY_FIGURES = [
    ("learner/updates_per_s", "updates/s", "{:,.1f}"),
    ("env/steps_per_s", "env steps/s", "{:,.0f}"),
    ("learner/steps_trained", "steps trained", "{:,.0f}"),
    ("replay/size", "replay items", "{:,.0f}"),
    ("env/episode_return_mean", "return (low-eps third)", "{:,.2f}"),
    ("eval/return_mean", "greedy eval return", "{:,.2f}"),
    ("sync/policy_lag", "policy lag", "{:,.2f}"),
    ("learner/device_busy", "device busy", "{:.0%}"),  # a CUDA learner only
]


class RunStatus(DashboardComponent):
    """Header: the empty state, or the run id, who reports, and key latest values."""

    def __init__(self, store: MetricsStore, **kw: Any) -> None:
        self.store = store
        self.source = None
        kw.setdefault("sizing_mode", "stretch_width")
        self.root = Div(text=self._empty_html(), **kw)

    @staticmethod
    def _empty_html() -> str:
        return (
            f'<div style="font-size:1.4em;padding:1em"><b>{EMPTY_TEXT}</b><br>'
            '<span style="font-size:0.7em">Ape-X actors publish on the scheduler event log '
            "(topic <code>apex-metrics</code>); plots appear with the first report.</span></div>"
        )

    def update(self) -> None:
        run, _, latest = self.store.snapshot()
        if run is None:
            text = self._empty_html()
        else:
            sources = sorted(self.store.sources)
            shards = sum(s.startswith("replay/") for s in sources)
            envs = sum(s.startswith("env/") for s in sources)
            others = [s for s in sources if not s.startswith(("replay/", "env/"))]
            counts = [(shards, "replay shards"), (envs, "env workers")]
            who = ", ".join([*others, *(f"{n} {what}" for n, what in counts if n)])
            age = time.time() - (self.store.updated or time.time())
            out = getattr(self.store, "out", None)
            where = f" &mdash; folder <code>{html.escape(out)}</code>" if out else ""
            state = "done" if getattr(self.store, "done", False) else "running"
            cells = "".join(
                f"<td style='padding:0 1em'><b>{fmt.format(latest[name])}</b><br>{label}</td>"
                for name, label, fmt in _KEY_FIGURES
                if name in latest and math.isfinite(latest[name])
            )
            text = (
                f'<div style="padding:0.5em">Run <b>{html.escape(run)}</b> ({state}){where} '
                f"&mdash; reporting: {html.escape(who)} &mdash; last report {age:.1f} s ago, "
                f"{self.store.messages} messages<table><tr>{cells}</tr></table></div>"
            )
        if text != self.root.text:
            self.root.text = text


class HealthStrip(DashboardComponent):
    """A strip under the header: is the run right, not only alive? Green while no
    supervised task failed (``health/task_failures``) and no law of the counters was
    broken (``health/invariant_violations``); else red, naming each task and law with
    its count."""

    OK_STYLE = "background:#e6f4ea;color:#137333"
    BAD_STYLE = "background:#fce8e6;color:#a50e0e"

    def __init__(self, store: MetricsStore | RunView, **kw: Any) -> None:
        self.store = store
        self.source = None
        kw.setdefault("sizing_mode", "stretch_width")
        self.root = Div(text="", visible=False, **kw)

    def update(self) -> None:
        run, _, latest = self.store.snapshot()
        tasks, laws = latest.get("health/task_failures"), latest.get("health/invariant_violations")
        if run is None or tasks is None or laws is None:
            self.root.visible = False
            return
        bad = [
            f"{html.escape(name.split('/', 2)[2])} {what} x{latest[name]:,.0f}"
            for name, what in sorted(
                (n, "failed" if "/task_failures/" in n else "violated")
                for n in latest
                if n.startswith(("health/task_failures/", "health/invariant_violations/"))
            )
            if latest[name] > 0
        ]
        style = self.BAD_STYLE if bad else self.OK_STYLE
        said = "; ".join(bad) if bad else "every background task running, every law holding"
        text = (
            f'<div style="{style};padding:0.3em 0.8em;border-radius:4px">'
            f"<b>health</b>: {tasks:,.0f} task failures, {laws:,.0f} invariant violations"
            f" &mdash; {said}</div>"
        )
        self.root.visible = True
        if text != self.root.text:
            self.root.text = text


class RunSelector(DashboardComponent):
    """A ``Select`` of the runs the store keeps (newest first, each with its folder and
    whether it is done); the first entry follows the newest run. Choosing one
    points ``view`` (a :class:`~.metrics_view.RunView`) at it."""

    NEWEST = ""

    def __init__(self, view: RunView) -> None:
        self.view = view
        self.source = None
        self._runs: list[tuple[str, str]] = []
        self.root = Select(title="Run", value=self.NEWEST, options=[(self.NEWEST, "newest")])
        self.root.on_change("value", lambda _attr, _old, new: self.view.select(new or None))

    def update(self) -> None:
        runs = [
            (
                r["run"],
                f"{r['run']}{' ' + r['out'] if r['out'] else ''}{' (done)' if r['done'] else ''}",
            )
            for r in self.view.runs()
        ]
        if runs != self._runs:
            self._runs = runs
            newest = f"newest ({runs[0][0]})" if runs else "newest"
            self.root.options = [(self.NEWEST, newest), *runs]
            if self.root.value not in {self.NEWEST, *(r for r, _ in runs)}:
                self.root.value = self.NEWEST
        self.root.visible = len(runs) > 1 or self.root.value != self.NEWEST


class EvalAnimation(DashboardComponent):
    """The newest greedy evaluation episode of the run shown, as a looping GIF.

    The evaluator sends one at most every 30 s when ``eval.animation`` is on
    (the ``cartpole`` and ``minatar`` presets); without one the box says so.
    """

    OFF_TEXT = (
        "<i>No evaluation animation yet (on with <code>--set eval.animation=true</code>; "
        "the cartpole and minatar presets have it)</i>"
    )

    def __init__(self, view: RunView | MetricsStore) -> None:
        self.view = view
        self.source = None
        self._shown: tuple[str | None, float | None] = (None, None)
        self.root = Div(text=self.OFF_TEXT, width=260)

    def update(self) -> None:
        anim = getattr(self.view, "animation", None)
        key = (self.view.run, None if anim is None else anim["time"])
        if key == self._shown:
            return
        self._shown = key
        if anim is None:
            self.root.text = self.OFF_TEXT
            return
        import base64

        data = base64.b64encode(anim["gif"]).decode()
        ret = anim["return"]
        caption = (
            f"greedy eval episode: return {'-' if ret is None else f'{ret:g}'}, "
            f"{anim['length']} steps, weights v{anim['weights_version']}, "
            f"{time.strftime('%H:%M:%S', time.localtime(anim['time']))}"
        )
        self.root.text = (
            f'<div><img src="data:image/gif;base64,{data}" '
            'style="image-rendering:pixelated;width:240px"><br>'
            f"<small>{html.escape(caption)}</small></div>"
        )
