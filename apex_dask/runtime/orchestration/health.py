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

from typing import Any

from apex_dask.runtime.actors.calls import call_with_timeout
from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.orchestration.state import RunState
from apex_dask.runtime.orchestration.tasks import Job, TaskSet

__all__ = ["LearnerHealth"]


class LearnerHealth(Job):
    """Raises :class:`ApexRuntimeError` once the learner reports a ``thread_error``."""

    def __init__(
        self, state: RunState, tasks: TaskSet, timeout_s: float, every_s: float = 1.0
    ) -> None:
        super().__init__(tasks, every_s)
        self.state, self.timeout = state, timeout_s

    def due(self, now: float) -> bool:
        return not self.state.halting

    async def start(self, now: float) -> str | None:  # type: ignore[override]
        try:
            return await call_with_timeout(self.state.learner.thread_error(), self.timeout)
        except Exception:  # a lost learner is reported where its calls fail
            return None

    def done(self, result: Any, exc: BaseException | None) -> None:
        if exc is None and result:
            raise ApexRuntimeError(f"the learner thread failed: {result}")
