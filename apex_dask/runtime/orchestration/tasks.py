"""Calls in flight on the driver's loop, each with its own handler, and the plan's jobs.

::

    tasks = TaskSet(timeout_s=60)
    tasks.spawn(lambda: worker.sample_into(k), on_done=lambda task: ...)
    while running:
        for job in jobs:            # Job subclasses: report, health, checkpoints, ...
            job.tick(time.monotonic())
        await tasks.step(0.1)       # runs the handlers of the calls that finished

Dask's ``wait``/``as_completed`` do not work on actor futures, so this uses
``asyncio.wait(FIRST_COMPLETED)``. A handler that raises stops the loop
that called :meth:`TaskSet.step`: an :class:`~apex_dask.runtime.errors.ApexRuntimeError`
as it is (the run ends as its one line says), any other error as a failure of the
supervised task ``driver.calls`` (counted in ``state``'s :class:`TaskFailures`, then
:class:`~apex_dask.runtime.errors.BackgroundTaskFailed`). A :class:`Job` follows its
name's policy (:data:`~apex_dask.runtime.actors.supervision.TASKS`): a failed run of a
``restart`` job is counted and the job runs again at its next due time.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from apex_dask.runtime.actors.calls import call_with_timeout
from apex_dask.runtime.actors.supervision import END, TASKS, TaskFailures
from apex_dask.runtime.errors import ApexRuntimeError, BackgroundTaskFailed

__all__ = ["Handler", "Job", "TaskSet", "task_error"]

Handler = Callable[[asyncio.Future], Awaitable[None] | None]


def task_error(task: asyncio.Future) -> BaseException | None:
    """The task's exception (``CancelledError`` if it was cancelled), or None."""
    return asyncio.CancelledError() if task.cancelled() else task.exception()


class TaskSet:
    """Calls in flight, each with the handler that runs when it is done.

    Each task reports its own end (a done callback puts it on a queue of finished
    tasks), so :meth:`step` costs the same with 10 or 1,000 calls in flight;
    ``asyncio.wait`` over every task in flight, as before, cost work per task on
    every step (``docs/scaling.md``).
    """

    def __init__(self, timeout_s: float, failures: TaskFailures | None = None) -> None:
        self.timeout = timeout_s
        self.failures = failures if failures is not None else TaskFailures("the driver")
        self._tasks: dict[asyncio.Future, Handler] = {}
        self._finished: deque[asyncio.Future] = deque()
        self._waiter: asyncio.Future | None = None

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(
        self, make: Callable[[], Any], on_done: Handler, *, timeout: bool | float = True
    ) -> None:
        """Run the actor call ``make()`` in a task with the call timeout (``True``), none
        (``False``) or ``timeout`` seconds.

        The call is made *inside* the task: a handle whose worker was lost
        raises on attribute access, and that error becomes the task's.
        """

        async def call() -> Any:
            fut = make()
            if timeout is False:
                return await fut
            return await call_with_timeout(fut, self.timeout if timeout is True else timeout)

        self.add(call(), on_done)

    def add(self, coro: Awaitable[Any], on_done: Handler) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks[task] = on_done
        task.add_done_callback(self._on_finished)

    def _on_finished(self, task: asyncio.Future) -> None:
        if task not in self._tasks:  # cancelled by :meth:`cancel`
            return
        self._finished.append(task)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def step(self, timeout_s: float) -> None:
        """Wait for the first call(s) to finish and run their handlers."""
        if not self._tasks:
            await asyncio.sleep(min(timeout_s, 0.05))
            return
        if not self._finished:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            wake = loop.call_later(timeout_s, _wake, waiter)
            try:
                await waiter
            finally:
                wake.cancel()
                self._waiter = None
        while self._finished:  # a handler that raises leaves the rest for the next step
            task = self._finished.popleft()
            handler = self._tasks.pop(task, None)
            if handler is None:
                continue
            try:
                if not isinstance(handler, _JobHandler):  # a job follows its own policy
                    self.failures.check("driver.calls")
                result = handler(task)
                if result is not None:
                    await result
            except ApexRuntimeError:
                raise
            except Exception as exc:
                raise self.ended("driver.calls", exc) from exc

    def ended(self, name: str, exc: BaseException) -> BackgroundTaskFailed:
        """Count task ``name``'s failure; the error that ends the run, naming it."""
        line = self.failures.failed(name, exc)
        return BackgroundTaskFailed(name, f"background task {line}; stopping the run")

    async def drain(self, timeout_s: float) -> None:
        """Handle what finishes within ``timeout_s`` (nothing new should start); cancel the rest."""
        deadline = time.monotonic() + timeout_s
        while self._tasks and time.monotonic() < deadline:
            await self.step(1.0)
        self.cancel()

    def cancel(self) -> None:
        tasks = list(self._tasks)
        self._tasks.clear()
        self._finished.clear()
        for task in tasks:
            task.cancel()


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _JobHandler:
    """A job's handler of its run's task (a job follows its own policy on failure)."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def __call__(self, task: asyncio.Future) -> Awaitable[None] | None:
        return self.job._finished(task)


class Job:
    """One job the plan's loop ticks, with at most one run in flight.

    ``tick(now)`` starts a run when none is pending, ``every_s`` has passed
    since the last start and :meth:`due` agrees; :meth:`start` makes the run's
    coroutine (anything to do at once happens there); :meth:`done` gets its
    result or error (by default an error stops the run). :meth:`soon` lifts the
    ``every_s`` wait once. A cancelled run (the plan drains) gets no ``done``.

    Supervised as ``name`` (:data:`~apex_dask.runtime.actors.supervision.TASKS`): an
    error out of :meth:`done` other than an ``ApexRuntimeError`` (a deliberate end
    of the run, with its own line) is counted; a ``restart`` job then runs again at
    its next due time, an ``end`` job ends the run with
    :class:`~apex_dask.runtime.errors.BackgroundTaskFailed`.
    """

    name = "driver.job"

    def __init__(self, tasks: TaskSet, every_s: float = 0.0) -> None:
        self.tasks = tasks
        self.every_s = float(every_s)
        self.pending = False
        self._next = 0.0

    def due(self, now: float) -> bool:
        return True

    def start(self, now: float) -> Awaitable[Any]:
        raise NotImplementedError

    def done(self, result: Any, exc: BaseException | None) -> Awaitable[None] | None:
        if exc is not None:
            raise exc
        return None

    def tick(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self.pending or now < self._next or not self.due(now):
            return
        self.pending, self._next = True, now + self.every_s
        self.tasks.add(self.start(now), _JobHandler(self))

    def soon(self) -> None:
        self._next = 0.0

    def _finished(self, task: asyncio.Future) -> Awaitable[None] | None:
        self.pending = False
        if task.cancelled():
            return None
        exc = task.exception()
        return self._supervised(None if exc is not None else task.result(), exc)

    async def _supervised(self, result: Any, exc: BaseException | None) -> None:
        try:
            self.tasks.failures.check(self.name)
            out = self.done(result, exc)
            if out is not None:
                await out
        except ApexRuntimeError:
            raise
        except Exception as error:
            if TASKS.get(self.name, END) == END:
                raise self.tasks.ended(self.name, error) from error
            self.tasks.failures.failed(self.name, error)
