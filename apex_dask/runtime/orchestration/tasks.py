"""Calls in flight on the driver's loop, each with its own handler.

::

    tasks = TaskSet(timeout_s=60)
    tasks.spawn(lambda: worker.sample_into(k), on_done=lambda task: ...)
    while running:
        await tasks.step(0.1)       # runs the handlers of the calls that finished

Dask's ``wait``/``as_completed`` do not work on actor futures, so this uses
``asyncio.wait(FIRST_COMPLETED)``. A handler that raises stops the loop
that called :meth:`TaskSet.step`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from apex_dask.runtime.actors.calls import call_with_timeout

__all__ = ["Handler", "TaskSet"]

Handler = Callable[[asyncio.Future], Awaitable[None] | None]


class TaskSet:
    """Calls in flight, each with the handler that runs when it is done."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout = timeout_s
        self._tasks: dict[asyncio.Future, Handler] = {}

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
        self._tasks[asyncio.ensure_future(coro)] = on_done

    async def step(self, timeout_s: float) -> None:
        """Wait for the first call(s) to finish and run their handlers."""
        if not self._tasks:
            await asyncio.sleep(min(timeout_s, 0.05))
            return
        done, _ = await asyncio.wait(
            list(self._tasks), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        for task in done:
            result = self._tasks.pop(task)(task)
            if result is not None:
                await result

    async def drain(self, timeout_s: float) -> None:
        """Handle what finishes within ``timeout_s`` (nothing new should start); cancel the rest."""
        deadline = time.monotonic() + timeout_s
        while self._tasks and time.monotonic() < deadline:
            await self.step(1.0)
        self.cancel()

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
