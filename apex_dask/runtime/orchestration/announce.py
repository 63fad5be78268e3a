"""What the driver tells the outside about a run: the dashboard's link and the scheduler's
metrics store (its output folder, that it is done)."""

from __future__ import annotations

from typing import Any

__all__ = ["announce", "dashboard_link"]


def dashboard_link(client: Any, embedded: bool) -> str | None:
    """The ``/apex`` page's link when the scheduler serves it (an embedded cluster always
    does; another gets the plugin if it can import apex_dask), else Dask's own."""
    from apex_dask.runtime.observability.preload import dashboard_url, ensure_plugin

    try:
        page = True if embedded else bool(ensure_plugin(client))
    except Exception:  # a scheduler that cannot import apex_dask
        page = False
    try:
        return dashboard_url(client) if page else client.dashboard_link
    except Exception:
        return None


def announce(client: Any, run_id: str, timeout_s: float = 5.0, **fields: Any) -> None:
    """Tell the scheduler's metrics store about run ``run_id`` (its ``out`` folder,
    ``done``), waiting at most ``timeout_s``: metrics never stop or hold up a run."""
    from apex_dask.runtime.observability.metrics import TOPIC, make_message

    msg = make_message(run_id, "driver", {}, **fields)
    try:
        client.sync(
            client.scheduler.log_event, topic=TOPIC, msg=msg, callback_timeout=max(0.1, timeout_s)
        )
    except Exception:
        pass
