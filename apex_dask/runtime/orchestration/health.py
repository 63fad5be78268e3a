"""A once-a-second check that the learner thread still runs.

Paced env workers (``learner.min_replay_ratio``) wait for the learner; if its
thread dies (a non-finite loss, a hook that raised) no iteration may ever
end, so the check made when a result is gathered would never run. This
check asks the learner for its thread's error (a few bytes, not its stats:
the control plane stays lean) about once a second and stops the run with
the thread's error (one line). A learner that does not answer is left
to the fault handling of the calls that fail.

:class:`TaskHealth` adds up the failures of supervised background tasks
(:mod:`apex_dask.runtime.actors.supervision`) that the actors report with their
stats and the driver counts itself: ``health/task_failures`` and one count per
task in every result; each task's first failure on each actor is noted once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from apex_dask.runtime.actors.calls import call_with_timeout
from apex_dask.runtime.actors.supervision import TASK_FAILURES, TASKS, TaskFailures
from apex_dask.runtime.errors import BackgroundTaskFailed
from apex_dask.runtime.orchestration.state import RunState
from apex_dask.runtime.orchestration.tasks import Job, TaskSet

__all__ = ["LearnerHealth", "TaskHealth", "learner_thread_failed"]


class LearnerHealth(Job):
    """Raises :class:`ApexRuntimeError` once the learner reports a ``thread_error``."""

    name = "driver.learner_health"

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
            raise learner_thread_failed(result)


def learner_thread_failed(error: str) -> BackgroundTaskFailed:
    """The end of a run whose learner thread died with ``error``."""
    return BackgroundTaskFailed(
        "learner.thread", f"the learner thread failed: {error}; stopping the run"
    )


class TaskHealth:
    """Failures of supervised tasks, per actor and task, added up for each result.

    ``see(source, stats)`` takes the ``health/task_failures/<task>`` counts an actor
    reported (``source``: its key; a rebuilt actor counts afresh, the lost one's last
    counts stay); ``metrics()`` adds the driver's own (``failures``). The first failure of
    each task on each actor gives one note and one log line.
    """

    def __init__(self, failures: TaskFailures, note: Any = None) -> None:
        self.failures = failures
        self.note = note
        self._seen: dict[tuple[Any, str], float] = {}
        self._told: set[str] = set()  # the driver's own tasks already told

    def see(self, source: Any, who: str, stats: Mapping[str, Any]) -> None:
        prefix = TASK_FAILURES + "/"
        for name, value in stats.items():
            if not name.startswith(prefix) or not isinstance(value, int | float):
                continue
            task = name[len(prefix) :]
            before = self._seen.get((source, task), 0.0)
            self._seen[(source, task)] = max(before, float(value))
            if before == 0 and value > 0:
                self._tell(task, who)

    def _tell(self, task: str, who: str) -> None:
        """One warning line (``apex_dask.health``) and a note: task ``task`` failed."""
        then = "restarted" if TASKS.get(task) == "restart" else "ending the run"
        line = f"background task {task} failed on {who} ({then}; its log has the traceback)"
        logging.getLogger("apex_dask.health").warning(line)
        if self.note is not None:
            self.note(line)

    def metrics(self) -> dict[str, float]:
        """``health/task_failures`` and ``health/task_failures/<task>`` for every task."""
        per = dict.fromkeys(TASKS, 0.0)
        for (_, task), n in self._seen.items():
            per[task] = per.get(task, 0.0) + n
        for task, n in list(self.failures.counts.items()):
            per[task] = per.get(task, 0.0) + n
            if task not in self._told:
                self._told.add(task)
                self._tell(task, "the driver")
        out = {f"{TASK_FAILURES}/{task}": n for task, n in per.items()}
        out[TASK_FAILURES] = float(sum(per.values()))
        return out
