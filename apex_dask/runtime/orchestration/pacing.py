"""Optional pacing of env workers to the learner (``learner.min_replay_ratio``).

Ape-X lets env workers run free. On a machine where the learner is slower
than its env workers, that trains far fewer times per transition than the
in-process runner does; with ``min_replay_ratio`` rho, env workers wait
(their next rollout is held) while transitions trained < rho * (items added
to the replay - slack). The learner's progress (transitions trained, items
added as its prefetcher last saw them) is polled with a cheap call. Items
added, not env steps sampled: rollouts lost with a shard never count, so the
learner's own ``max_replay_ratio`` gate, which counts the same items, can
always let it catch up.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from apex_dask.runtime.actors.calls import call_with_timeout

if TYPE_CHECKING:
    from apex_dask.runtime.orchestration.faults import EnvSlot
    from apex_dask.runtime.orchestration.plan import ExecutionPlan

__all__ = ["ReplayRatioPacer"]


class ReplayRatioPacer:
    """Holds env workers' next rollouts while the learner is behind ``rho`` (None: never)."""

    def __init__(self, plan: ExecutionPlan, rho: float | None) -> None:
        self.plan = plan
        self.rho = rho
        self._trained = 0  # learner's steps trained, as last seen
        self._added = 0  # items added to all shards, as the learner last saw them
        self._held: list[EnvSlot] = []
        self._pending = False
        self._last_poll = -float("inf")

    def new_session(self) -> None:
        self._held, self._pending = [], False

    def trained(self, steps_trained: int) -> None:
        """The learner's transitions trained, as a report saw them."""
        self._trained = max(self._trained, steps_trained)

    def behind(self) -> bool:
        """True while training has started and transitions trained < rho * (items
        added - slack). The slack, four fragments per rollout in flight, lets env
        workers run a little ahead: a learner capped at the same ratio by
        ``max_replay_ratio`` (which counts items *stored*, a few n-step tails
        fewer) then never waits on env workers that wait on it (measured: one
        fragment of slack left the learner idle 24% of the time, four: 2%)."""
        if self.rho is None or self._trained <= 0 or self._added <= 0:
            return False
        w = self.plan.cfg.workers
        slack = 4 * len(self.plan.slots) * w.rollouts_in_flight * w.rollout_fragment_length
        return self._trained < self.rho * (self._added - slack)

    def hold(self, slot: EnvSlot) -> bool:
        """After a rollout of ``slot``: True if its next rollout must wait (it is held)."""
        if self.rho is None:
            return False
        held = self.behind()
        if held:
            self._held.append(slot)  # relaunched once the learner has caught up
        self._maybe_poll()
        return held

    def _maybe_poll(self) -> None:
        """Ask the learner how far it is, at most every 20 ms (50 ms while nobody waits)."""
        if self._pending:
            return
        now = time.monotonic()
        gap = 0.02 if self._held else 0.05
        if not self._held and now - self._last_poll < gap:
            return
        delay = max(0.0, self._last_poll + gap - now)
        self._pending = True

        async def poll() -> tuple[int, int]:
            if delay:
                await asyncio.sleep(delay)
            self._last_poll = time.monotonic()
            return await call_with_timeout(self.plan.learner.progress(), self.plan.timeout)

        self.plan.tasks.add(poll(), self._polled)

    def _polled(self, task: asyncio.Future) -> None:
        self._pending = False
        exc = None if task.cancelled() else task.exception()
        if task.cancelled():
            return
        if exc is not None:  # lost? the recovery check rebuilds it; held slots wait for it
            self.plan.recovery.soon()
            self._last_poll = time.monotonic() + 0.5
            if self._held:
                self._maybe_poll()
            return
        trained, added = task.result()
        self.trained(trained)
        self._added = int(added)  # a rebuilt learner may know fewer: taken as it is
        if not self.behind():
            held, self._held = self._held, []
            if not self.plan.halting:
                for slot in held:
                    self.plan.store.launch(slot)
        if self._held:
            self._maybe_poll()
