"""How long a stop may take: ``checkpoint.grace_s`` from the first signal, split among its steps.

::

    clock = StopClock(grace_s=120.0)          # started when the signal arrives
    d.halt(clock.halt_s(call_timeout))        # at most 20% of the grace
    d.save_checkpoint("preempted", within_s=clock.checkpoint_s())   # up to the exit's share
    d.learner_weights(clock.weights_s(call_timeout))   # only without a checkpoint
    d.stop(clock.exit_s())                    # release the actors, close the cluster
    clock.left()                              # seconds until the grace is spent

The grace runs from the moment the first SIGINT, SIGTERM or SIGUSR1 arrives.
The last 15% of it (0.5 to 10 s) is kept for the exit: releasing the actors,
closing the cluster, ending the process. The halt may take up to 20% of it
(and the call timeout); the checkpoint gets everything else until the exit's
share begins, less 5% of the grace: the final weights come from its learner
part, and are fetched from the learner (at most 10% of the grace and the call
timeout) only when no checkpoint was written. What one step leaves unused
goes to the next. A watchdog (:meth:`start_watchdog`) ends the process in one
line when the grace is spent, whatever is still running.

A SIGTERM may leave less: a batch system sends SIGKILL some time after it
(SLURM's ``KillWait`` after a plain ``scancel``, PBS's ``kill_delay`` after
``qdel``). ``APEX_TERM_GRACE_S`` (the job scripts set it from the site's
setting) caps the grace of a SIGTERM.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable

__all__ = ["TERM_GRACE_ENV", "StopClock", "grace_for"]

TERM_GRACE_ENV = "APEX_TERM_GRACE_S"
"""Environment variable: the most seconds a SIGTERM leaves (a batch system's SIGKILL follows)."""


def grace_for(signame: str, grace_s: float, env: dict[str, str] | None = None) -> float:
    """The grace of a stop by ``signame``: ``grace_s``, capped for SIGTERM by
    :data:`TERM_GRACE_ENV` when that is a positive number."""
    if signame != "SIGTERM":
        return float(grace_s)
    raw = (os.environ if env is None else env).get(TERM_GRACE_ENV, "")
    try:
        cap = float(raw)
    except ValueError:
        return float(grace_s)
    return min(float(grace_s), cap) if math.isfinite(cap) and cap > 0 else float(grace_s)


class StopClock:
    """The deadline of one stop and each step's share of it (see the module docstring)."""

    EXIT_SHARE, HALT_SHARE, WEIGHTS_SHARE = 0.15, 0.20, 0.10

    def __init__(self, grace_s: float, start: float | None = None) -> None:
        self.grace_s = float(grace_s)
        self.start = time.monotonic() if start is None else start
        self.end = self.start + self.grace_s
        self.exit_reserve = min(10.0, max(0.5, self.EXIT_SHARE * self.grace_s))
        self._watchdog: threading.Timer | None = None

    def left(self) -> float:
        """Seconds until the grace is spent (0 after)."""
        return max(0.0, self.end - time.monotonic())

    def _before_exit(self) -> float:
        return max(0.0, self.end - self.exit_reserve - time.monotonic())

    def halt_s(self, cap: float) -> float:
        """The halt's bound: 20% of the grace, ``cap`` and what is left before the exit."""
        return max(0.1, min(cap, self.HALT_SHARE * self.grace_s, self._before_exit()))

    def weights_s(self, cap: float) -> float:
        """The final weights' bound: 10% of the grace, ``cap`` and what is left."""
        return max(0.1, min(cap, self.WEIGHTS_SHARE * self.grace_s, self._before_exit()))

    def checkpoint_s(self) -> float:
        """The checkpoint's budget: what is left before the exit's share, less 5% of the
        grace for fetching the weights should the checkpoint fail (a checkpoint's
        learner part holds them)."""
        return max(0.1, self._before_exit() - 0.05 * self.grace_s)

    def exit_s(self) -> float:
        """The bound of releasing the actors and closing the cluster: what is left, less
        a moment for the process to end."""
        return max(0.1, self.left() - min(1.0, 0.2 * self.exit_reserve))

    def start_watchdog(self, on_expiry: Callable[[], None]) -> None:
        """Call ``on_expiry()`` (it ends the process) in a daemon thread once the grace
        is spent, less 0.2 s for the process to end."""
        if self._watchdog is not None:
            return
        self._watchdog = threading.Timer(max(0.0, self.left() - 0.2), on_expiry)
        self._watchdog.daemon = True
        self._watchdog.name = "apex-stop-watchdog"
        self._watchdog.start()
