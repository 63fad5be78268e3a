"""The learner's priority sender: each trained batch's new priorities to its source shard.

::

    sender = PrioritySender(links, failures, timeout_s)   # links: the learner's ShardLinks
    sender.start()                  # on the worker's loop (a supervised task)
    sender.put(update)              # from the learner thread: into the outbox, no wake-up
    sender.shard_replaced(k, lost)  # shard k is a new actor
    await sender.stop(timeout_s)    # flush the outbox, wait for the updates in flight

The sender drains the outbox every ``poll_s`` (4 ms): an update to a shard on
this worker is applied inline (a function call); one to another process is a
task with the call timeout. Polling, rather than a wake-up per batch from the
learner thread, keeps the learner thread from handing the GIL to the loop after
every update. A failed update is counted (``failed``) and the sender goes on; the
sender itself runs supervised (``learner.priority_sender``: restarted if it fails).

Per shard id, since its current actor was set, :meth:`ledger` counts the updates
dispatched to it, those that failed and those in flight: the driver's
priority-update law (:mod:`apex_dask.runtime.orchestration.invariants`) holds them
against the shard's applied and stale counts. When a shard is rebuilt after its
worker was lost (``lost=True``), the updates still waiting on the old one end at
once (failed) instead of after the call timeout.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from apex_dask.algo.replay.sample import PriorityUpdate
from apex_dask.runtime.actors.calls import PeerCalls, actor_key
from apex_dask.runtime.actors.failpoints import failpoint
from apex_dask.runtime.actors.prefetch import ShardLinks
from apex_dask.runtime.actors.supervision import TaskFailures, start_supervised

__all__ = ["PrioritySender"]


class PrioritySender:
    """Sends the outbox's priority updates to their shards (see the module docstring)."""

    def __init__(
        self, links: ShardLinks, failures: TaskFailures, timeout_s: float, poll_s: float = 0.004
    ) -> None:
        self._links, self._failures = links, failures
        self._timeout, self._poll_s = float(timeout_s), float(poll_s)
        self.outbox: deque[PriorityUpdate] = deque()
        self.sent = self.failed = 0
        self.errors: deque[str] = deque(maxlen=10)
        self._calls = PeerCalls()
        self._ledger = [[0, 0, 0] for _ in range(len(links))]  # dispatched, failed, in flight
        self._pending: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._drops = 0  # the drop_priority_update_every failpoint's count

    def put(self, update: PriorityUpdate) -> None:
        """Queue one update (any thread)."""
        self.outbox.append(update)

    def start(self) -> None:
        self._stopping = False
        self._task = start_supervised("learner.priority_sender", self._run, self._failures)

    async def stop(self, timeout_s: float) -> None:
        """Send what is queued, then wait for the updates in flight (``timeout_s`` each)."""
        if self._task is not None:
            self._stopping = True
            await asyncio.wait([self._task], timeout=timeout_s)
            self._task = None
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=timeout_s)

    def shard_replaced(self, shard_id: int, lost: bool) -> None:
        """Shard ``shard_id`` is a new actor: its ledger starts afresh; ``lost``: updates
        waiting on the old one end now (failed)."""
        self._ledger[shard_id] = [0, 0, 0]
        if lost:
            self._calls.replaced(("shard", shard_id))

    @property
    def in_flight(self) -> int:
        """Updates sent to shards in other processes, not answered yet."""
        return sum(x[2] for x in self._ledger)

    def ledger(self) -> list[tuple[Any, int, int, int]]:
        """Per shard id: ``(the key of the shard actor updates go to, updates dispatched to
        it since it was set, of them failed, in flight)``."""
        return [
            (actor_key(self._links.handle(k)), *self._ledger[k]) for k in range(len(self._links))
        ]

    async def _run(self) -> None:
        while True:
            self._failures.check("learner.priority_sender")
            while self.outbox and not failpoint("stall_priority_sender"):
                update = self.outbox.popleft()
                self.sent += 1
                k = update.shard_id
                ledger = self._ledger[k]
                ledger[0] += 1
                if (every := failpoint("drop_priority_update_every")) and self._drop(every):
                    continue  # a failpoint: counted as sent, never delivered
                if self._links.is_local(k):
                    try:
                        await self._links.target(k).update_priorities(*update.args())
                    except Exception as exc:
                        self._failed(k, ledger, exc)
                    continue
                ledger[2] += 1
                task = asyncio.create_task(self._send_one(update, ledger))
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
            if self._stopping:
                return
            await asyncio.sleep(self._poll_s)

    def _drop(self, every: float) -> bool:
        self._drops += 1
        return self._drops % int(every) == 0

    def _failed(self, k: int, ledger: list[int], exc: BaseException) -> None:
        self.failed += 1
        ledger[1] += 1
        self.errors.append(f"priorities to shard {k}: {type(exc).__name__}: {exc}")

    async def _send_one(self, update: PriorityUpdate, ledger: list[int]) -> None:
        k = update.shard_id
        try:
            call = self._links.target(k).update_priorities(*update.args())
            await self._calls.call(("shard", k), call, self._timeout)
        except Exception as exc:
            self._failed(k, ledger, exc)
        finally:
            ledger[2] -= 1
