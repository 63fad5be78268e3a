"""HTTP views of the Ape-X metrics on the scheduler: JSON and Prometheus.

- ``GET /apex/metrics.json`` returns :meth:`MetricsStore.to_json` of the
  newest run, or of ``run=ID`` (404 with the known run ids if it is not kept;
  every document lists the runs under ``runs``); query arguments ``names``
  (comma separated or repeated, shell-style patterns such as
  ``replay/*/size``), ``since`` (unix seconds; only later points) and
  ``series=0`` (latest values only). Requests are bounded (:data:`LIMITS`): a
  query string of at most 4096 bytes, at most 32 patterns of at most 200
  characters, no body, at most 4 documents being built at once; past a bound
  the answer is a 4xx (503 when busy) whose body is one line of JSON,
  ``{"error": "..."}``. The patterns are matched as one compiled expression,
  and the document is built and encoded in a thread: the scheduler's event
  loop only hands the request over.
- Prometheus gauges on the scheduler's ``/metrics``, read from the latest
  values at scrape time by :class:`ApexCollector` (see :func:`prometheus_name`),
  one series per run with a ``run`` label; ``apex_run_info{run, out}`` is 1
  while a run reports and 0 once it is done.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from distributed.http.utils import RequestHandler
from tornado.ioloop import IOLoop
from tornado.web import stream_request_body

from apex_dask.runtime.observability.metrics import get_plugin
from apex_dask.runtime.observability.metrics_store import MetricsStore

if TYPE_CHECKING:
    from distributed import Scheduler

ROUTE = "/apex"  # the Ape-X dashboard page
JSON_ROUTE = "apex/metrics.json"

_SHARD = re.compile(r"^replay/(\d+)/(.+)$")
_WORKER = re.compile(r"^env/([a-z_]+)/(-?\d+)$")  # an env worker's exploration parameter
_ENV = re.compile(r"^env/(-?\d+)/(.+)$")
_QUANTILE = re.compile(r"^(.+)/q(\d+)$")
_HEALTH = re.compile(r"^health/(task_failures|invariant_violations)/(.+)$")
_HEALTH_LABEL = {"task_failures": "task", "invariant_violations": "law"}
_BAD = re.compile(r"[^a-zA-Z0-9_]")


def prometheus_name(metric: str) -> tuple[str, dict[str, str]]:
    """Map a metric name to a Prometheus gauge family and labels.

    ``/`` becomes ``_``, a trailing ``_per_s`` becomes ``_per_second`` and a
    trailing ``_s`` becomes ``_seconds``; everything gets the ``apex_`` prefix.
    Per-entity names become labels: ``replay/<k>/size`` ->
    ``apex_replay_size{shard="k"}``, ``env/epsilon/<i>`` ->
    ``apex_env_epsilon{worker="i"}`` (so each agent's exploration parameter,
    ``env/noise_scale/<i>`` too), ``env/<i>/<x>`` ->
    ``apex_env_worker_<x>{worker="i"}`` (``-1``: the evaluator), ``<name>/q<p>`` ->
    ``<family>_quantile{quantile="p/100"}``, ``health/task_failures/<name>`` ->
    ``apex_health_task_failures{task="<name>"}``, ``health/invariant_violations/<law>``
    -> ``apex_health_invariant_violations{law="<law>"}``. The all-shard totals
    ``replay/<x>`` (and the health totals ``health/<x>``) become ``apex_replay_<x>_all``
    (``apex_health_<x>_all``) so they do not share a family with the labelled gauges.
    """
    labels: dict[str, str] = {}
    base = metric
    m = _SHARD.match(metric)
    if m:
        labels["shard"] = m.group(1)
        base = "replay/" + m.group(2)
    elif (w := _WORKER.match(metric)) is not None:
        labels["worker"] = w.group(2)
        base = f"env/{w.group(1)}"
    elif (e := _ENV.match(metric)) is not None:
        labels["worker"] = e.group(1)
        base = "env/worker/" + e.group(2)
    elif (h := _HEALTH.match(metric)) is not None:
        labels[_HEALTH_LABEL[h.group(1)]] = h.group(2)
        base = "health/" + h.group(1)
    suffix = ""
    q = _QUANTILE.match(base)
    if q:
        base, labels["quantile"] = q.group(1), str(int(q.group(2)) / 100)
        suffix = "_quantile"
    elif base.startswith(("replay/", "health/")) and not labels:
        suffix = "_all"
    name = _units(base.replace("/", "_"))
    return _BAD.sub("_", f"apex_{name}{suffix}"), labels


def _units(name: str) -> str:
    if name.endswith("_per_s"):
        return name[: -len("_per_s")] + "_per_second"
    if name.endswith("_s"):
        return name[: -len("_s")] + "_seconds"
    return name


class ApexCollector:
    """Prometheus collector reading the latest Ape-X metrics at scrape time.

    One instance per process is registered in ``prometheus_client.REGISTRY``;
    ``store`` points at the store of the most recently set-up scheduler.
    """

    def __init__(self, store: MetricsStore | None = None) -> None:
        self.store = store

    def describe(self) -> list[Any]:
        return []  # names vary with the run; do not collect at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily  # extra: prometheus

        store = self.store
        if store is None:
            return
        runs = store.runs()
        if not runs:
            return
        info = GaugeMetricFamily(
            "apex_run_info",
            "Ape-X runs on this scheduler (1: running, 0: done)",
            labels=["run", "out"],
        )
        families: dict[str, tuple[Any, list[str]]] = {}
        for summary in runs:
            run = summary["run"]
            info.add_metric([run, summary["out"] or ""], 0.0 if summary["done"] else 1.0)
            _, _, latest = store.snapshot(run)
            for metric in sorted(latest):
                family, labels = prometheus_name(metric)
                labels["run"] = run
                keys = sorted(labels)
                if family not in families:
                    help_text = f"Ape-X metric {_help(metric, labels)}"
                    families[family] = (GaugeMetricFamily(family, help_text, labels=keys), keys)
                fam, fam_keys = families[family]
                if fam_keys != keys:  # a name that breaks the family's label set
                    continue
                fam.add_metric([labels[k] for k in keys], latest[metric])
        yield info
        yield from (fam for fam, _ in families.values())


def _help(metric: str, labels: dict[str, str]) -> str:
    if "task" in labels or "law" in labels:
        return _HEALTH.sub(r"health/\1/<name>", metric)
    if "shard" in labels:
        metric = _SHARD.sub(r"replay/<k>/\2", metric)
    if "worker" in labels:
        metric = _ENV.sub(r"env/<i>/\2", _WORKER.sub(r"env/\1/<i>", metric))
    return _QUANTILE.sub(r"\1/q<p>", metric)


_COLLECTOR: ApexCollector | None = None


def register_prometheus(store: MetricsStore) -> bool:
    """Serve ``store`` on ``/metrics``; False when prometheus_client is missing."""
    global _COLLECTOR
    try:
        import prometheus_client  # extra: prometheus
    except ModuleNotFoundError:
        return False
    if _COLLECTOR is None:
        _COLLECTOR = ApexCollector(store)
        prometheus_client.REGISTRY.register(_COLLECTOR)
    _COLLECTOR.store = store
    return True


LIMITS = {
    "query_bytes": 4096,
    "patterns": 32,
    "pattern_chars": 200,
    "body_bytes": 8 << 20,
    "busy": 4,
}
"""Bounds of a ``/apex/metrics.json`` request. A body of up to ``body_bytes`` is read and
refused (413); a longer one is cut off by Tornado (400, connection closed)."""


class Refused(Exception):
    """A request past a bound: its status and one line saying why and what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@stream_request_body  # a body is counted and dropped as it arrives, never parsed
class ApexMetricsJSON(RequestHandler):
    """``GET /apex/metrics.json[?run=ID]``: run id, latest values and time series."""

    building = 0  # documents being built now, in this process

    def prepare(self) -> None:
        self.request.connection.set_max_body_size(LIMITS["body_bytes"])
        self.body_bytes = 0

    def data_received(self, chunk: bytes) -> None:
        self.body_bytes += len(chunk)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        reason = self._reason or "error"  # e.g. 405 for a POST: still one line of JSON
        self._send({"error": f"{status_code} {reason}: GET /{JSON_ROUTE}?names=...&since=..."})

    def _send(self, doc: dict[str, Any]) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(doc) + "\n")

    def _query(self) -> dict[str, Any]:
        """The store's ``to_json`` arguments, or :class:`Refused`."""
        if self.body_bytes or self.request.headers.get("Content-Length", "0") not in ("", "0"):
            raise Refused(413, "the request has a body: pass names=PATTERN,... in the query")
        if len(self.request.query) > LIMITS["query_bytes"]:
            raise Refused(414, f"query string longer than {LIMITS['query_bytes']} bytes")
        args = self.request.query_arguments
        names = [
            p.strip() for a in args.get("names", []) for p in a.decode(errors="replace").split(",")
        ]
        names = [p for p in names if p]
        if len(names) > LIMITS["patterns"]:
            raise Refused(
                400, f"{len(names)} names patterns; at most {LIMITS['patterns']} per request"
            )
        if any(len(p) > LIMITS["pattern_chars"] for p in names):
            raise Refused(400, f"a names pattern longer than {LIMITS['pattern_chars']} characters")
        since = self.get_query_argument("since", "-inf")
        try:
            t0 = float(since)
        except ValueError:
            raise Refused(400, f"since={since[:40]!r} is not a number (unix seconds)") from None
        if math.isnan(t0):
            raise Refused(400, "since=nan is not a time (unix seconds)")
        series = self.get_query_argument("series", "1") not in ("0", "false", "no")
        return {"names": names, "since": t0, "series": series,
                "run": self.get_query_argument("run", "") or None}  # fmt: skip

    async def get(self) -> None:
        store = get_plugin(self.server).store
        try:
            query = self._query()
        except Refused as refused:
            self.set_status(refused.status)
            self._send({"error": str(refused)})
            return
        if ApexMetricsJSON.building >= LIMITS["busy"]:
            self.set_status(503)
            self.set_header("Retry-After", "1")
            self._send({"error": f"{LIMITS['busy']} documents are being built; retry in a second"})
            return
        ApexMetricsJSON.building += 1
        try:  # off the event loop: matching, copying and encoding may take a while
            status, chunks = await IOLoop.current().run_in_executor(
                _builder(), _document, store, query
            )
            self.set_status(status)
            self.set_header("Content-Type", "application/json")
            self.set_header("Cache-Control", "no-store")
            pending = 0
            for chunk in chunks:  # 256 KB at a time, the loop's other work in between
                self.write(chunk)
                pending += len(chunk)
                if pending >= 1 << 18:
                    await self.flush()
                    await asyncio.sleep(0)  # a flush the socket took at once does not yield
                    pending = 0
            self.finish()
        finally:
            ApexMetricsJSON.building -= 1

    def compute_etag(self) -> None:
        return None  # no hash of a large body on the event loop


_BUILDER: list[ThreadPoolExecutor] = []


def _builder() -> ThreadPoolExecutor:
    """One thread builds the documents, one after the other: the event loop shares the
    interpreter with at most that one busy thread."""
    if not _BUILDER:
        _BUILDER.append(ThreadPoolExecutor(1, thread_name_prefix="apex-metrics-json"))
    return _BUILDER[0]


def _document(store: MetricsStore, query: dict[str, Any]) -> tuple[int, list[bytes]]:
    try:
        return 200, store.json_chunks(**query)
    except KeyError:
        known = [r["run"] for r in store.runs()]
        error = {"error": f"no run {query['run']!r} on this scheduler", "runs": known}
        return 404, [json.dumps(error).encode()]


_ROUTED: weakref.WeakSet[Any] = weakref.WeakSet()


def http_prefix(scheduler: Scheduler) -> str:
    """The dashboard's URL prefix (``/`` unless ``--dashboard-prefix``), ending in ``/``."""
    for app in getattr(scheduler.http_application, "applications", []):
        prefix = getattr(app, "prefix", None)
        if isinstance(prefix, str) and prefix:
            return "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
    return "/"


def add_json_route(scheduler: Scheduler) -> bool:
    """Add ``/apex/metrics.json`` to the scheduler's HTTP server, once."""
    app = getattr(scheduler, "http_application", None)
    if app is None:
        return False
    if app not in _ROUTED:
        url = http_prefix(scheduler) + JSON_ROUTE
        app.add_handlers(r".*", [(url, ApexMetricsJSON, {"dask_server": scheduler})])
        _ROUTED.add(app)
    return True
