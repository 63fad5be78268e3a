"""What the CLI shows of a run between results: replaced actors, the placement file,
and where Dask's own log lines go.

::

    watcher = PlacementWatcher(driver, out)   # writes placement.json now
    watcher.poll()                            # at most once a second: one line per
                                              # replaced env worker, placement.json rewritten
    route_logs(out / LOG_NAME, debug=False)   # Dask's records to the log file, not the console
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from apex_dask.cli.outdir import OutputError, write_json

__all__ = ["PlacementWatcher", "route_logs"]

PREFIX = "apex-dask-submit:"


class PlacementWatcher:
    """Follows ``driver.placement``: a replaced actor gets one console line, and
    ``placement.json`` (under ``out``) is rewritten whenever the placement changes."""

    def __init__(self, driver: Any, out: Path | None, every_s: float = 1.0) -> None:
        self.driver, self.out, self.every_s = driver, out, every_s
        self._next = 0.0
        self.placement: dict[str, Any] = {}
        self.replaced = 0
        self.poll(force=True)

    def poll(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.every_s
        try:
            new = self.driver.placement
        except Exception:  # the driver is being torn down
            return
        if not new or new == self.placement:
            return
        old, self.placement = self.placement, new
        if old:
            self._announce(old, new)
        if self.out is not None:
            try:
                write_json(self.out / "placement.json", new, indent=2)
            except OutputError as exc:
                print(f"{PREFIX} {exc}", flush=True)

    def _announce(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        pairs = list(zip(old.get("env_workers", []), new.get("env_workers", []), strict=False))
        names = [f"env worker {i}" for i in range(len(pairs))]
        if old.get("evaluator") and new.get("evaluator"):
            pairs.append((old["evaluator"], new["evaluator"]))
            names.append("the evaluator")
        for name, (was, now) in zip(names, pairs, strict=True):
            if was.get("address") != now.get("address"):
                self.replaced += 1
                print(
                    f"{PREFIX} {name} was lost with its Dask worker {was.get('address')}; "
                    f"replaced on {now.get('name') or now.get('address')}",
                    flush=True,
                )


def route_logs(log_file: Path | None, *, debug: bool) -> None:
    """Send Dask's (and tornado's, bokeh's, Python warnings') records to ``log_file``
    instead of the console, so each way a run ends prints one line. ``debug``: keep
    everything on the console as well."""
    import distributed  # noqa: F401 - its import installs the console handlers replaced here

    logging.captureWarnings(True)
    if debug:
        return
    handler: logging.Handler
    if log_file is not None:
        handler = logging.FileHandler(log_file, delay=True)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    else:
        handler = logging.NullHandler()
    for name in ("distributed", "tornado", "bokeh", "py.warnings", "asyncio"):
        logger = logging.getLogger(name)
        for h in list(logger.handlers):
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                logger.removeHandler(h)
        logger.addHandler(handler)
        logger.propagate = False


def log_traceback(log_file: Path | None, exc: BaseException) -> bool:
    """Append ``exc``'s traceback to ``log_file``; whether it was written."""
    import traceback

    if log_file is None:
        return False
    try:
        with open(log_file, "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} apex-dask-submit traceback:\n")
            f.write("".join(traceback.format_exception(exc)))
    except OSError:
        return False
    return True
