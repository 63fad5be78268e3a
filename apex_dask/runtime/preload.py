"""``dask scheduler --preload apex_dask.runtime.preload``: the stable name of the preload.

The module lives in :mod:`apex_dask.runtime.observability.preload`; this
name is kept because users' scheduler command lines and job scripts use it.
"""

from apex_dask.runtime.observability.preload import (
    NAV_PAGE,
    PAGE_ADDED,
    PRELOAD,
    ROUTE,
    add_nav_link,
    dashboard_url,
    dask_setup,
    ensure_plugin,
    install,
    page_available,
)

__all__ = [
    "NAV_PAGE",
    "PAGE_ADDED",
    "PRELOAD",
    "ROUTE",
    "add_nav_link",
    "dashboard_url",
    "dask_setup",
    "ensure_plugin",
    "install",
    "page_available",
]
