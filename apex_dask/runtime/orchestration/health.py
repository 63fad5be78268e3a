"""A once-a-second check that the learner thread still runs.

Paced env workers (``learner.min_replay_ratio``) wait for the learner; if its
thread dies (a non-finite loss, a hook that raised) no iteration may ever
end, so the check made when a result is gathered would never run. This
check asks the learner for its thread's error (a few bytes, not its stats:
the control plane stays lean) about once a second and stops the run with
the thread's error (one line). A learner that does not answer is left
to the fault handling of the calls that fail.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from apex_dask.runtime.actors.calls import call_with_timeout
from apex_dask.runtime.errors import ApexRuntimeError

if TYPE_CHECKING:
    from apex_dask.runtime.orchestration.plan import ExecutionPlan

__all__ = ["LearnerHealth"]


class LearnerHealth:
    """``tick()`` from the plan's loop; raises :class:`ApexRuntimeError` once the
    learner reports a ``thread_error``."""

    def __init__(self, plan: ExecutionPlan, every_s: float = 1.0) -> None:
        self.plan, self.every_s = plan, every_s
        self._pending = False
        self._next = 0.0

    def tick(self) -> None:
        now = time.monotonic()
        if self._pending or now < self._next or self.plan.halting:
            return
        self._pending, self._next = True, now + self.every_s
        self.plan.tasks.add(self._thread_error(), self._checked)

    async def _thread_error(self) -> str | None:
        try:
            return await call_with_timeout(self.plan.learner.thread_error(), self.plan.timeout)
        except Exception:  # a lost learner is reported where its calls fail
            return None

    def _checked(self, task: asyncio.Future) -> None:
        self._pending = False
        error = None if task.cancelled() or task.exception() else task.result()
        if error:
            raise ApexRuntimeError(f"the learner thread failed: {error}")
