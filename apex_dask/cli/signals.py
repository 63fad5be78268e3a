"""Ctrl-C, SIGTERM and SIGUSR1 for ``apex-dask-submit``: honoured at any moment.

::

    stops = StopSignals.install()          # in the main thread, before anything starts
    stops.phase = "running"                # from now on a signal only asks to stop
    ... if stops.requested: break          # polled at least once a second
    stops.restore()

- **Start-up** (``phase == "startup"``): the first signal raises
  :class:`Interrupted` in the main thread, so a cluster being started or
  actors being created are released again on the way out.
- **Running / saving**: the first signal is recorded (``requested``) and
  one line says what happens next; the run loop stops, saves what exists
  and exits with the documented code.
- A **second** Ctrl-C (or SIGTERM), at any moment until the process ends,
  prints one line and exits at once (``os._exit``: nothing more is saved;
  the processes this one started, an embedded cluster's workers, are
  killed first). A SIGTERM within 2 s of the first is the same stop passed
  on twice (a batch system signals every process of a job, and the job
  script passes the stop on to this one): it is ignored.
- With a grace (``install(grace_s=checkpoint.grace_s)``; for a SIGTERM at
  most ``APEX_TERM_GRACE_S``, :mod:`apex_dask.cli.stopclock`), the whole stop,
  whatever phase it came in, ends within it: a watchdog ends the process in
  one line when it is spent, with what was saved by then.

SIGTERM and SIGUSR1 (``scancel``, a batch system's time limit with
``--signal=B:USR1@...``, ``docker stop``) mean *preempted*: the CLI writes a
checkpoint when the driver can and exits 75 then, else 143
(:mod:`apex_dask.cli.exitcodes`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from apex_dask.cli.exitcodes import EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_TERMINATED
from apex_dask.cli.stopclock import StopClock, grace_for

__all__ = ["Interrupted", "StopSignals", "exit_now_if_signalled"]

PREFIX = "apex-dask-submit:"


class Interrupted(KeyboardInterrupt):
    """A stop signal during start-up; ``signame`` is ``SIGINT``, ``SIGTERM`` or ``SIGUSR1``."""

    def __init__(self, signame: str) -> None:
        super().__init__(signame)
        self.signame = signame


class StopSignals:
    """The CLI's handlers for SIGINT, SIGTERM and SIGUSR1 (see the module docstring)."""

    HANDLED = ("SIGINT", "SIGTERM", "SIGUSR1")
    saving = {"SIGINT": "the weights", "SIGTERM": "a checkpoint and the weights"}
    """What the first signal's line says is saved (a sweep sets its own)."""
    DUPLICATE_S = 2.0
    """A SIGTERM this soon after the first is the same stop (see the module docstring)."""

    def __init__(self, prefix: str = PREFIX, grace_s: float | None = None) -> None:
        self.prefix = prefix
        self.phase = "startup"
        self.requested: str | None = None
        self.grace_s = grace_s  # checkpoint.grace_s of the run (None: no watchdog)
        self.clock: StopClock | None = None  # started by the first signal, with a grace
        self.checkpoint: Any = None  # the stop's checkpoint once written (the watchdog's 75)
        self._first_at: float | None = None
        self._previous: dict[int, Any] = {}

    @classmethod
    def install(cls, prefix: str = PREFIX, grace_s: float | None = None) -> StopSignals:
        """Install the handlers (main thread only); ``prefix`` starts their lines; with
        ``grace_s`` a stop ends within it (see the module docstring)."""
        global _ACTIVE
        self = _ACTIVE = cls(prefix, grace_s)
        if threading.current_thread() is threading.main_thread():
            for name in cls.HANDLED:
                signum = getattr(signal, name, None)
                if signum is not None:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        """Put the previous handlers back, unless a stop was requested: then a second
        signal still exits at once, in one line, however far the exit has got
        (closing Dask's threads, interpreter shutdown) instead of a traceback or -2."""
        if self.requested is not None:
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    @property
    def preempted(self) -> bool:
        """Stopped by SIGTERM or SIGUSR1 (a batch system or container manager)."""
        return self.requested in ("SIGTERM", "SIGUSR1")

    def reason(self) -> str:
        if self.requested == "SIGINT":
            return "interrupted (Ctrl-C)"
        return f"preempted ({self.requested})"

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and name in ("SIGINT", "SIGTERM"):
            first = self._first_at
            if name == self.requested == "SIGTERM" and first is not None:
                if time.monotonic() - first < self.DUPLICATE_S:
                    return  # the same stop, passed on by the job script too
            code = EXIT_INTERRUPTED if name == "SIGINT" else EXIT_TERMINATED
            _say(f"{name} again: exiting now, without saving more (exit {code})", self.prefix)
            _kill_children()
            os._exit(code)
        if self.requested is not None:
            return  # a repeated SIGUSR1: already stopping
        self.requested, self._first_at = name, time.monotonic()
        within = ""
        if self.grace_s is not None:
            self.clock = StopClock(grace_for(name, self.grace_s), start=self._first_at)
            self.clock.start_watchdog(self._grace_spent)
            within = f" within {self.clock.grace_s:g} s"
        if self.phase == "startup":
            _say(
                f"{name}: stopping while the run starts{within} (Ctrl-C again to exit at once)",
                self.prefix,
            )
            raise Interrupted(name)
        what = self.saving.get(name, self.saving["SIGTERM"])
        _say(f"{name}: stopping, saving {what}{within} (Ctrl-C again to exit at once)", self.prefix)

    def _grace_spent(self) -> None:
        """The watchdog: the stop outlasted its grace; end the process with what is saved."""
        if self.requested == "SIGINT":
            code = EXIT_INTERRUPTED
        else:
            code = EXIT_PREEMPTED if self.checkpoint is not None else EXIT_TERMINATED
        grace = self.clock.grace_s if self.clock is not None else self.grace_s
        late = f"the stop outlasted its grace ({grace:g} s, checkpoint.grace_s): exiting now"
        if code == EXIT_PREEMPTED:  # the line the end of the run would have printed
            line = (
                f"preempted ({self.requested}); checkpoint {self.checkpoint}; {late} (exit {code})"
            )
        else:
            line = f"{late} with what was saved (exit {code})"
        _say(line, self.prefix)
        _kill_children()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


_ACTIVE: StopSignals | None = None
"""The handlers installed last (the run of this process)."""


def exit_now_if_signalled(code: int) -> None:
    """End the process with ``code`` now if a signal stopped its run.

    Everything is saved and closed by then. Interpreter shutdown puts the
    default handlers back before the process is gone: a second Ctrl-C in
    that window ended it with -2 or a traceback. So the exit handlers run
    here (the helper processes of an embedded cluster are stopped, which
    also closes the console pipes they share), under this module's handler,
    and the process ends without the rest of the shutdown.
    """
    if _ACTIVE is None or _ACTIVE.requested is None:
        return
    import atexit

    try:
        atexit._run_exitfuncs()  # multiprocessing's, logging's, Dask's
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _kill_children() -> None:
    """SIGKILL the processes this one started (an embedded cluster's workers, its
    forkserver): they would otherwise outlive it and print their errors."""
    try:
        import psutil

        children = psutil.Process().children(recursive=True)
    except Exception:  # psutil missing or the process table unreadable
        return
    for child in children:
        try:
            child.kill()
        except Exception:  # already gone
            pass


def _say(line: str, prefix: str = PREFIX) -> None:
    try:
        sys.stderr.write(f"\n{prefix} {line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
