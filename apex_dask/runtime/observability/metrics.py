"""Metrics transport: actors and the driver -> the scheduler's event log -> a plugin.

Message format (``docs/metrics.md``), logged under topic ``apex-metrics``::

    {"run": <run id>, "source": "learner" | "replay/<k>" | "env/<i>" | "driver",
     "time": <unix s>, "metrics": {name: float}}
    # the driver also sends {..., "out": <its --out folder>} at the start and
    # {..., "done": true} when it stops

Actors publish through a :class:`MetricsPublisher` created in their
``__init__``; the driver publishes result dicts with
:func:`publish_from_client`. Each name has one source (:func:`actor_names`,
:func:`driver_names`): two sources of one counter would interleave a value read
earlier with a newer one, and a cumulative series would step back.
:class:`ApexMetricsPlugin` receives every message
on the scheduler (``SchedulerPlugin.log_event``) and keeps them in a
:class:`~apex_dask.runtime.observability.metrics_store.MetricsStore`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

from apex_dask.runtime.observability.metrics_store import DEFAULT_MAX_POINTS, MetricsStore

if TYPE_CHECKING:
    from distributed import Client, Scheduler

TOPIC = "apex-metrics"
ANIMATION_TOPIC = "apex-animation"
"""The evaluator's GIF of its newest evaluation episode (``eval.animation``):
``{"run", "source", "time", "gif": bytes, "return", "length", "weights_version"}``."""
PLUGIN_NAME = "apex-metrics"
RUN_TOTALS = ("flow/", "health/")
"""Name prefixes only the driver publishes: run totals, lost actors' counts included."""

Sink = Callable[[str, dict[str, Any]], None]


def make_message(
    run: str, source: str, metrics: Mapping[str, Any], **fields: Any
) -> dict[str, Any]:
    """One transport message; values become plain floats, non-numbers are dropped.

    ``fields`` join the message as they are when not None: ``out`` (the run's
    output folder) and ``done`` (True: the run ended) describe the run.
    """
    clean: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            clean[str(name)] = float(value)
        except (TypeError, ValueError):
            continue
    msg = {"run": str(run), "source": str(source), "time": time.time(), "metrics": clean}
    msg.update({k: v for k, v in fields.items() if v is not None})
    return msg


def actor_names(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """What an actor publishes of its stats: its own names (``learner/*``,
    ``replay/<k>/*``, ``env/<i>/*``, ...), not the run totals (:data:`RUN_TOTALS`)."""
    return {k: v for k, v in metrics.items() if not k.startswith(RUN_TOTALS)}


def driver_names(
    row: Mapping[str, float], actor_stats: Iterable[Mapping[str, Any]]
) -> dict[str, float]:
    """What the driver publishes of a result ``row``: all but the names the actors whose
    ``actor_stats`` it holds publish themselves (:func:`actor_names`), read by the actor
    when it publishes rather than when the driver asked."""
    own = {name for stats in actor_stats for name in actor_names(stats)}
    return {k: v for k, v in row.items() if k not in own}


def worker_sink() -> Sink | None:
    """``Worker.log_event`` of the worker running this code, or None outside a worker."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except ValueError:
        return None
    return worker.log_event


class MetricsPublisher:
    """Rate-limited metrics sender for one source (an actor, a thread of it).

    Create it in the actor's ``__init__``: it captures the worker there
    (``get_worker()`` fails in threads the actor starts). Then, from any
    thread::

        pub = MetricsPublisher("learner", run="2024-05-01T12:00-ab12")
        pub.publish({"learner/grad_s": 0.004, "learner/queue_size": 3.0})
        pub.flush()  # at the end

    ``publish`` merges the values into a pending dict (later values of a name
    replace earlier ones) and sends the pending dict at most once per
    ``min_interval_s``; ``force=True`` sends now. So a learner may call it
    every step: the cost per call is a lock and a dict update, and a message
    (one ``log_event``, ~17 us) leaves at most once a second. Values still
    pending when the interval has not passed go with the next send or
    ``flush()``.

    ``sink(topic, msg)`` defaults to the current worker's ``log_event``;
    outside a worker (in-process runs) and without a sink, nothing is sent
    (``enabled`` is False) but the calls stay valid.
    """

    def __init__(
        self,
        source: str,
        run: str,
        topic: str = TOPIC,
        min_interval_s: float = 1.0,
        sink: Sink | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.run = run
        self.topic = topic
        self.min_interval_s = float(min_interval_s)
        self._sink = sink if sink is not None else worker_sink()
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[str, Any] = {}
        self._last_sent = -math.inf
        self.sent = 0
        self.errors = 0

    @property
    def enabled(self) -> bool:
        """Whether messages go anywhere."""
        return self._sink is not None

    def publish(self, metrics: Mapping[str, Any], force: bool = False) -> bool:
        """Record ``metrics``; send the pending values if the interval passed or ``force``.

        Returns True when a message was sent by this call.
        """
        now = self._clock()
        with self._lock:
            self._pending.update(metrics)
            if not force and now - self._last_sent < self.min_interval_s:
                return False
            return self._send_locked(now)

    def flush(self) -> bool:
        """Send the pending values now, if any; True when a message was sent."""
        with self._lock:
            return self._send_locked(self._clock()) if self._pending else False

    def _send_locked(self, now: float) -> bool:
        if not self._pending:
            return False
        msg = make_message(self.run, self.source, self._pending)
        self._pending = {}
        self._last_sent = now
        if self._sink is None:
            return False
        try:
            self._sink(self.topic, msg)
        except Exception:  # a closing worker must not take the actor down
            self.errors += 1
            return False
        self.sent += 1
        return True


def publish_from_client(
    client: Client,
    run: str,
    metrics: Mapping[str, Any],
    source: str = "driver",
    topic: str = TOPIC,
    **fields: Any,
) -> Any:
    """Publish one metrics dict from the driver's client (``client.log_event``).

    With a synchronous client this blocks for one round trip to the scheduler
    and returns None; with an asynchronous client it returns an awaitable.
    """
    return client.log_event(topic, make_message(run, source, metrics, **fields))


SETTINGS = {  # Dask configuration key under apex.metrics: (default, least allowed)
    "points": (3600, 4),
    "max-points": (DEFAULT_MAX_POINTS, 4),
    "max-runs": (8, 1),
    "max-animations": (4, 0),
}
"""The scheduler's metrics store bounds, read from Dask's configuration: ``points`` per
series, ``max-points`` in all (series x points, 16 bytes each), ``max-runs`` kept side
by side, ``max-animations`` evaluation GIFs left in the scheduler's event log. Set them
as ``DASK_APEX__METRICS__MAX_POINTS=500000`` in the scheduler's environment, or in a
Dask YAML file (``apex: {metrics: {max-points: 500000}}``)."""


def store_settings(**given: int | None) -> dict[str, int]:
    """``{"points", "max-points", "max-runs", "max-animations"}``: what ``given`` says
    (keys with ``_``), else Dask's configuration, else the defaults. A bad value raises a
    one-line ValueError naming the setting and how to set it."""
    import dask

    out = {}
    for key, (default, least) in SETTINGS.items():
        raw = given.get(key.replace("-", "_"))
        if raw is None:
            raw = dask.config.get(f"apex.metrics.{key}", default)
        try:
            value = int(raw)
            ok = value == float(raw) and value >= least
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            env = "DASK_APEX__METRICS__" + key.upper().replace("-", "_")
            raise ValueError(
                f"apex.metrics.{key} must be a whole number >= {least}, got {raw!r} "
                f"(Dask configuration, e.g. {env}={default})"
            )
        out[key] = value
    return out


class ApexMetricsPlugin(SchedulerPlugin):
    """Scheduler plugin keeping Ape-X metrics from ``log_event`` in a :class:`MetricsStore`.

    Its ``name`` is fixed, and ``idempotent`` is set, so registering it twice
    (preload and driver) keeps the first instance and its data. Bounds as in
    :data:`SETTINGS` (None: Dask's configuration). The evaluator's GIFs also
    stay in the scheduler's own event log (Dask keeps 1,000 events a topic):
    the plugin trims that topic to the newest ``max_animations``.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(
        self,
        topic: str = TOPIC,
        maxlen: int | None = None,
        resolution_s: float = 1.0,
        max_points: int | None = None,
        max_runs: int | None = None,
        max_animations: int | None = None,
    ):
        self.topic = topic
        self.settings = store_settings(
            points=maxlen, max_points=max_points, max_runs=max_runs, max_animations=max_animations
        )
        self.max_animations = self.settings["max-animations"]
        self.store = MetricsStore(
            maxlen=self.settings["points"],
            resolution_s=resolution_s,
            max_runs=self.settings["max-runs"],
            max_points=self.settings["max-points"],
        )
        self.scheduler: Scheduler | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Shipped by client.register_plugin: the settings travel, the data does not.
        return {"topic": self.topic, "res": self.store.resolution_s, "settings": self.settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        given = {k.replace("-", "_"): v for k, v in state["settings"].items()}
        maxlen = given.pop("points")
        self.__init__(state["topic"], maxlen, state["res"], **given)  # type: ignore[misc]

    async def start(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == self.topic and isinstance(msg, Mapping):
            self.store.ingest(msg)
        elif topic == ANIMATION_TOPIC and isinstance(msg, Mapping):
            self.store.set_animation(msg)
            self._trim_animations()

    def _trim_animations(self) -> None:
        """Drop all but the newest ``max_animations`` GIFs from the scheduler's event log."""
        topics = getattr(getattr(self.scheduler, "_broker", None), "_topics", None)
        topic = topics.get(ANIMATION_TOPIC) if isinstance(topics, Mapping) else None
        events = getattr(topic, "events", None)
        while events is not None and len(events) > self.max_animations:
            events.popleft()


def get_plugin(scheduler: Scheduler, create: bool = True) -> ApexMetricsPlugin | None:
    """The scheduler's :class:`ApexMetricsPlugin`, added if missing and ``create``."""
    plugin = scheduler.plugins.get(PLUGIN_NAME)
    if plugin is None and create:
        plugin = ApexMetricsPlugin()
        scheduler.add_plugin(plugin, name=PLUGIN_NAME, idempotent=True)
        plugin = scheduler.plugins[PLUGIN_NAME]
    if isinstance(plugin, ApexMetricsPlugin):
        plugin.scheduler = scheduler  # its start() may not have run yet
    return plugin  # type: ignore[return-value]
