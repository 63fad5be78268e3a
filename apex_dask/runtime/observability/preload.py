"""Scheduler preload: the Ape-X dashboard page, metrics plugin, JSON and Prometheus.

Use it with any scheduler::

    dask scheduler --preload apex_dask.runtime.preload
    LocalCluster(scheduler_kwargs={"preload": [PRELOAD]})
    # or the config key distributed.scheduler.preload

Importing this module adds the ``/apex`` Bokeh page to
``distributed.dashboard.scheduler.applications``; a scheduler built after the
import (in this process) serves it. ``dask_setup(scheduler)``, run when the
scheduler starts, registers :class:`ApexMetricsPlugin`, the
``/apex/metrics.json`` route, the Prometheus collector and a link in the
dashboard's navigation bar. Every step is idempotent: Dask may import a
preload module twice, and the driver may call :func:`ensure_plugin` too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from apex_dask.runtime.observability.http import ROUTE, add_json_route, register_prometheus
from apex_dask.runtime.observability.metrics import get_plugin

if TYPE_CHECKING:
    from distributed import Client, Scheduler

PRELOAD = "apex_dask.runtime.preload"
NAV_PAGE = "apex"


def _add_page() -> bool:
    """Add ``/apex`` to the dashboard's page table (no-op without bokeh or if present)."""
    try:
        from distributed.dashboard import scheduler as dashboard

        from apex_dask.runtime.observability.dashboard import apex_doc
    except ImportError:  # bokeh missing or of a version Dask refuses
        return False
    dashboard.applications.setdefault(ROUTE, apex_doc)
    return True


PAGE_ADDED = _add_page()


def page_available(scheduler: Scheduler) -> bool:
    """Whether the scheduler's running Bokeh server serves ``/apex``."""
    for app in getattr(scheduler.http_application, "applications", []):
        if ROUTE in getattr(app, "app_paths", ()):
            return True
    return False


def add_nav_link(scheduler: Scheduler) -> bool:
    """Show "Apex" in the dashboard's navigation bar; True if it is there.

    Dask renders the bar from the ``pages`` list of the (memoized) template
    variables it built the dashboard with; adding to that list is all it
    takes. Without a served ``/apex`` page nothing is added.
    """
    if not page_available(scheduler):
        return False
    try:
        from distributed.dashboard.scheduler import template_variables

        pages = template_variables(scheduler).get("pages")
    except Exception:  # a Dask version that builds its navigation differently
        return False
    if not isinstance(pages, list):
        return False
    if NAV_PAGE not in pages:
        pages.insert(pages.index("info") if "info" in pages else len(pages), NAV_PAGE)
    return True


def install(scheduler: Scheduler) -> dict[str, bool]:
    """Register everything on ``scheduler`` (idempotent); say what is available."""
    plugin = get_plugin(scheduler)
    assert plugin is not None
    return {
        "plugin": True,
        "json": add_json_route(scheduler),
        "prometheus": register_prometheus(plugin.store),
        "page": page_available(scheduler),
        "nav": add_nav_link(scheduler),
    }


def dask_setup(scheduler: Scheduler) -> None:
    """Preload entry point, run by Dask when the scheduler starts."""
    install(scheduler)


def _ensure_on_scheduler(dask_scheduler: Scheduler) -> bool:
    return install(dask_scheduler)["page"]


def ensure_plugin(client: Client) -> bool:
    """Register the plugin, JSON route and Prometheus gauges on the client's scheduler.

    For a scheduler started without the preload (``apex_dask`` must be
    importable there). Returns whether the ``/apex`` page is served; the page
    itself needs the preload (or this module imported before the scheduler
    was built in the same process). With an asynchronous client, await the
    result.
    """
    return client.run_on_scheduler(_ensure_on_scheduler)


def _page_served(dask_scheduler: Scheduler) -> tuple[bool, str | None]:
    return page_available(dask_scheduler), _loopback_host(dask_scheduler)


def _loopback_host(scheduler: Scheduler) -> str | None:
    """The loopback address the scheduler's HTTP server listens on when it listens on
    nothing else (None otherwise, or when that cannot be told)."""
    sockets = getattr(getattr(scheduler, "http_server", None), "_sockets", None) or {}
    hosts = set()
    for sock in list(sockets.values()):
        try:
            hosts.add(str(sock.getsockname()[0]))
        except (OSError, IndexError):
            return None
    if hosts and all(h.startswith("127.") or h == "::1" for h in hosts):
        return min(hosts)
    return None


def dashboard_url(client: Client) -> str | None:
    """URL of the ``/apex`` page, or None when the scheduler does not serve it.

    Asks the scheduler (one round trip; synchronous client) whether its Bokeh
    dashboard has the page: the HTTP server runs even without a dashboard.
    Dask's link names the scheduler's host; a dashboard that listens on
    loopback only (the launchers' default) gets its loopback address instead.
    """
    try:
        link: Any = client.dashboard_link
        served, loopback = client.run_on_scheduler(_page_served) if link else (False, None)
        if not served:
            return None
    except Exception:  # no dashboard service, or apex_dask missing on the scheduler
        return None
    parts = urlsplit(str(link))
    path = parts.path
    path = path[: path.rfind("/") + 1] if "/" in path else "/"
    netloc = parts.netloc
    if loopback and parts.port:
        netloc = f"[{loopback}]:{parts.port}" if ":" in loopback else f"{loopback}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, path + ROUTE.lstrip("/"), "", ""))
