"""Supervised background work: no task or thread of the run dies silently.

Every asyncio task and thread a component of the run starts for itself runs
under a name from :data:`TASKS` and its policy. An exception is logged once per
name (``apex_dask.supervision``, with its traceback), counted
(``health/task_failures/<name>``; on ``/metrics`` the family
``apex_health_task_failures{task="<name>"}``), and then either

- **restart**: the task starts again after a short pause (doubling from 50 ms
  up to 2 s while it keeps failing), or
- **end**: the task stays down and the run ends with one line naming it
  (:class:`~apex_dask.runtime.errors.BackgroundTaskFailed`), after a checkpoint
  where one can be made.

::

    failures = TaskFailures("learner")
    task = start_supervised("learner.priority_sender", self._send_priorities, failures)
    failures.check("learner.priority_sender")   # inside a loop: a failpoint may raise here
    failures.metrics()                          # {"health/task_failures/<name>": n, ...}

The table of every task (where it runs, its policy and why) is
``docs/architecture.md``, "Background work"; tests inject a failure into each
(``task:<name>`` :mod:`.failpoints`) and check its outcome.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from apex_dask.runtime.actors.failpoints import InjectedFault, take_failpoint
from apex_dask.runtime.errors import describe

__all__ = [
    "END",
    "RESTART",
    "TASKS",
    "TASK_FAILURES",
    "TaskFailures",
    "run_supervised",
    "start_supervised",
]

RESTART, END = "restart", "end"

TASK_FAILURES = "health/task_failures"
"""The total; ``health/task_failures/<name>`` per task."""

TASKS: dict[str, str] = {
    # the learner's worker
    "learner.thread": END,
    "learner.prefetch": RESTART,
    "learner.priority_sender": RESTART,
    "learner.orphan_watch": RESTART,
    # the evaluator's worker
    "evaluator.animation": RESTART,
    # every env worker's (and the evaluator's) worker
    "env.orphan_watch": RESTART,
    # each host's weights relay
    "relay.orphan_watch": RESTART,
    # the driver: keeps one relay per host with env workers
    "driver.relays": RESTART,
    # the driver: the plan's jobs and the handlers of its actor calls
    "driver.report": END,
    "driver.evaluation": RESTART,
    "driver.learner_health": RESTART,
    "driver.checkpoints": RESTART,
    "driver.recovery": END,
    "driver.pacing": RESTART,
    "driver.elastic": END,
    "driver.invariants": RESTART,
    "driver.calls": END,
}
"""Every supervised task's name and policy (``docs/architecture.md`` says why each)."""

log = logging.getLogger("apex_dask.supervision")


class TaskFailures:
    """The failures of one component's supervised tasks (``owner``: e.g. ``"learner"``).

    Thread-safe. ``fatal`` is the first failure of an ``end`` task (``"<name>: Type:
    message"``), for the driver to end the run with; ``first`` the first line of each
    task's first failure.
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.counts: dict[str, int] = {}
        self.first: dict[str, str] = {}
        self.fatal: str | None = None
        self._lock = threading.Lock()

    def failed(self, name: str, exc: BaseException) -> str:
        """Count a failure of task ``name`` (logged the first time); its one line."""
        policy = TASKS.get(name, END)
        line = f"{name}: {describe(exc, 300)}"
        with self._lock:
            n = self.counts.get(name, 0) + 1
            self.counts[name] = n
            if n == 1:
                self.first[name] = line
            if policy == END and self.fatal is None:
                self.fatal = line
        if n == 1:
            then = "restarting it" if policy == RESTART else "ending the run"
            log.error(
                "%s: background task %s failed (%s)",
                self.owner,
                line,
                then,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
        return line

    def check(self, name: str) -> None:
        """Raise :class:`InjectedFault` if the failpoint ``task:<name>`` is on (once)."""
        if take_failpoint(f"task:{name}"):
            raise InjectedFault(f"failure injected into {name}")

    def metrics(self) -> dict[str, float]:
        """``health/task_failures/<name>`` for every task this component counted."""
        with self._lock:
            return {f"{TASK_FAILURES}/{k}": float(v) for k, v in self.counts.items()}

    def call(self, name: str, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` (a fire-and-forget job, e.g. in a pool): a failure is counted,
        and the next job runs as usual (its restart)."""
        try:
            self.check(name)
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - counted and logged, never lost
            self.failed(name, exc)


def _cancelled_from_outside() -> bool:
    """Whether the running task is being cancelled (not a ``CancelledError`` raised by
    an awaited call inside it, which is a failure like any other)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


async def run_supervised(
    name: str,
    run: Callable[[], Awaitable[None]],
    failures: TaskFailures,
    *,
    backoff_s: float = 0.05,
    max_backoff_s: float = 2.0,
) -> None:
    """Run ``run()`` until it returns. A failure is counted; a ``restart`` task then runs
    again after a pause (doubling from ``backoff_s`` to ``max_backoff_s``), an ``end`` task
    returns (``failures.fatal`` says why)."""
    delay = backoff_s
    while True:
        try:
            await run()
            return
        except asyncio.CancelledError as exc:
            if _cancelled_from_outside():
                raise
            failures.failed(name, exc)
        except Exception as exc:
            failures.failed(name, exc)
        if TASKS.get(name, END) == END:
            return
        await asyncio.sleep(delay)
        delay = min(max_backoff_s, 2 * delay)


def start_supervised(
    name: str, run: Callable[[], Awaitable[None]], failures: TaskFailures
) -> asyncio.Task:
    """:func:`run_supervised` as a task on the running loop."""
    return asyncio.create_task(run_supervised(name, run, failures), name=f"apex {name}")
