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

__all__ = [
    "PlacementWatcher",
    "drop_empty",
    "log_traceback",
    "quiet_teardown_logs",
    "route_logs",
]

PREFIX = "apex-dask-submit:"


class PlacementWatcher:
    """Follows ``driver.placement``: a replaced or rebuilt actor gets one console line, as
    does each elastic join, retirement and move (``driver.changes``), and
    ``placement.json`` (under ``out``) is rewritten whenever the placement changes."""

    def __init__(self, driver: Any, out: Path | None, every_s: float = 1.0) -> None:
        self.driver, self.out, self.every_s = driver, out, every_s
        self._next = 0.0
        self.placement: dict[str, Any] = {}
        self.replaced = 0
        self._changes = 0  # elastic changes already printed
        self.poll(force=True)

    def poll(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.every_s
        try:
            new = self.driver.placement
            changes = list(getattr(self.driver, "changes", []))
        except Exception:  # the driver is being torn down
            return
        for line in changes[self._changes :]:  # elastic joins, retirements and moves
            print(f"{PREFIX} {line}", flush=True)
        moved, self._changes = len(changes) > self._changes, len(changes)
        if not new or new == self.placement:
            return
        old, self.placement = self.placement, new
        if old and not moved:  # a change the lines above did not explain: a lost worker
            self._announce(old, new)
        if self.out is not None:
            try:
                write_json(self.out / "placement.json", new, indent=2)
            except OutputError as exc:
                print(f"{PREFIX} {exc}", flush=True)

    def _announce(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        pairs = [
            (was or {}, now or {})
            for was, now in zip(
                old.get("env_workers", []), new.get("env_workers", []), strict=False
            )
        ]
        names = [f"env worker {i}" for i in range(len(pairs))]
        if old.get("evaluator") and new.get("evaluator"):
            pairs.append((old["evaluator"], new["evaluator"]))
            names.append("the evaluator")
        rebuilt = list(zip(old.get("shards", []), new.get("shards", []), strict=False))
        pairs += [*rebuilt, (old.get("learner") or {}, new.get("learner") or {})]
        names += [f"replay shard {k}" for k in range(len(rebuilt))] + ["the learner"]
        for name, (was, now) in zip(names, pairs, strict=True):
            if not was.get("address") or not now.get("address"):
                continue  # a slot filled or emptied (elastic), not a lost worker
            if was.get("address") != now.get("address"):
                self.replaced += 1
                how = "replaced" if name.startswith(("env", "the eval")) else "rebuilt"
                print(
                    f"{PREFIX} {name} was lost with its Dask worker {was.get('address')}; "
                    f"{how} on {now.get('name') or now.get('address')}",
                    flush=True,
                )


ROUTED = (
    "distributed",
    "tornado",
    "bokeh",
    "py.warnings",
    "asyncio",
    "apex_dask.checkpoints",
    "apex_dask.supervision",
)
"""Loggers (with their children) whose records go to the run's log, not the console (the
CLI prints ``apex_dask.checkpoints``' lines itself, as notes)."""


def route_logs(log_file: Path | None, *, debug: bool) -> None:
    """Send Dask's (and tornado's, bokeh's, Python warnings') records to ``log_file``
    instead of the console, so each way a run ends prints one line. ``debug``: keep
    everything on the console as well.

    Child loggers with console handlers of their own (Dask gives one to
    ``distributed.client``) are routed too; an exception that ends a thread
    (a TensorBoard writer on a full disk) is logged rather than printed, and a
    record that cannot be written (a full disk) is dropped silently.
    """
    import threading

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
    manager = logging.Logger.manager
    names = [n for n in list(manager.loggerDict) if n.split(".")[0] in ROUTED]
    for name in sorted(set(names) | set(ROUTED)):
        logger = logging.getLogger(name)
        for h in list(logger.handlers):
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                logger.removeHandler(h)
        if name in ROUTED:
            logger.addHandler(handler)
            logger.propagate = False
        elif not logger.handlers:
            logger.propagate = True  # to its routed parent
    logging.raiseExceptions = False
    threads = logging.getLogger("apex_dask.threads")
    threads.addHandler(handler)
    threads.propagate = False
    health = logging.getLogger("apex_dask.health")  # a broken law, a failed task: one line
    console = logging.StreamHandler()
    console.setFormatter(logging.Formatter(f"{PREFIX} warning: %(message)s"))
    for h in list(health.handlers):  # a second run in this process: its own handlers
        health.removeHandler(h)
    for h in (console, handler):
        health.addHandler(h)
    health.propagate = False

    def excepthook(hook: threading.ExceptHookArgs) -> None:
        if hook.exc_type is SystemExit:
            return
        name = hook.thread.name if hook.thread is not None else "?"
        exc_info = (hook.exc_type, hook.exc_value, hook.exc_traceback)
        threads.error("exception in thread %s", name, exc_info=exc_info)  # type: ignore[arg-type]

    threading.excepthook = excepthook


def quiet_teardown_logs() -> None:
    """Closing a cluster whose actors hold threads makes Dask log kill warnings; expected."""
    for name in (
        "distributed.nanny",
        "distributed.worker",
        "distributed.core",
        "distributed.client",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)


def drop_empty(path: Path | None) -> None:
    """Remove ``path`` if it is an empty file (opened, then nothing could be written)."""
    try:
        if path is not None and path.is_file() and path.stat().st_size == 0:
            path.unlink()
    except OSError:
        pass


def log_traceback(log_file: Path | None, exc: BaseException) -> bool:
    """Append ``exc``'s traceback to ``log_file``; whether it was written (a failed
    write leaves no empty log behind)."""
    import traceback

    if log_file is None:
        return False
    try:
        with open(log_file, "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} apex-dask-submit traceback:\n")
            f.write("".join(traceback.format_exception(exc)))
    except OSError:
        drop_empty(log_file)
        return False
    return True


_PY_HELPERS = ("forkserver", "resource_tracker")
REAP_GRACE_S = 10.0
"""How long processes this one started may take to end after the cluster is closed."""


def child_pids() -> set[int]:
    """The processes this one started, and theirs, now."""
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def reap_children(
    log_file: Path | None,
    grace_s: float = REAP_GRACE_S,
    spare: frozenset[int] | set[int] = frozenset(),
) -> list[str]:
    """Wait up to ``grace_s`` for every process this one started (the embedded cluster's
    nannies and workers, a worker stuck in a hung env step) to end, then kill what is
    left and say so in ``log_file``; the command lines killed. ``spare``: pids that
    were there before the run (not its own). Python's own helpers (multiprocessing's
    forkserver and resource tracker) end with this process."""
    import psutil

    def ours(proc: psutil.Process) -> bool:
        try:
            line = " ".join(proc.cmdline())
        except psutil.Error:
            return False
        return not any(f"from multiprocessing.{m} import" in line for m in _PY_HELPERS)

    kids = [p for p in psutil.Process().children(recursive=True) if p.pid not in spare and ours(p)]
    _, alive = psutil.wait_procs(kids, timeout=grace_s)
    killed = []
    for proc in alive:
        try:
            killed.append(" ".join(proc.cmdline())[:160] or str(proc.pid))
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
    if killed and log_file is not None:
        try:
            with open(log_file, "a") as f:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                f.write(
                    f"{stamp} apex-dask-submit: killed {len(killed)} process(es) still "
                    f"running {grace_s:g} s after the cluster closed: {killed}\n"
                )
        except OSError:
            pass
    return killed
