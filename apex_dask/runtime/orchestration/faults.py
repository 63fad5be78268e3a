"""What the plan does when a call to an actor fails.

- A bug (the env raised, a method failed) stops the run with one line.
- A lost peer (the Dask worker holding the actor died, or a call timed out)
  starts a check: a lost learner or shard is rebuilt first (:mod:`.recovery`);
  if the env worker's own worker is gone it is re-created on a surviving
  worker (``faults/env_workers_replaced``) and its rollouts start again;
  otherwise the peer was only slow and is retried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from apex_dask.runtime.errors import ApexRuntimeError

if TYPE_CHECKING:
    from apex_dask.runtime.orchestration.plan import ExecutionPlan

__all__ = ["EnvSlot", "FaultHandler", "is_lost"]


@dataclass
class EnvSlot:
    """The driver's view of one env worker actor (its Future is kept: dropping it kills it).

    ``index`` -1 is the evaluator. ``version`` -1: the actor has no weights yet.
    """

    index: int
    future: Any
    handle: Any
    address: str
    epsilon: float
    steps_since_sync: int = 0
    version: int = -1
    syncing: bool = False
    retry_sync_at: float = 0.0
    in_flight: int = 0
    replacing: bool = False


def is_lost(exc: BaseException) -> bool:
    """Errors that mean the peer (its worker) is gone, rather than a bug in the env."""
    if isinstance(exc, OSError | TimeoutError | asyncio.TimeoutError):
        return True
    return "was lost" in str(exc) or "Unable to contact" in str(exc)


class FaultHandler:
    """Checks and replaces env workers for one :class:`ExecutionPlan`."""

    def __init__(
        self,
        plan: ExecutionPlan,
        replace_env_worker: Callable[[EnvSlot, dict[str, Any]], Awaitable[None]],
    ) -> None:
        self.plan = plan
        self.replace_env_worker = replace_env_worker
        self.env_workers_replaced = 0
        self.rollouts_failed = 0

    def counters(self) -> dict[str, float]:
        return {
            "faults/env_workers_replaced": float(self.env_workers_replaced),
            "faults/rollouts_failed": float(self.rollouts_failed),
            # rollout calls finished, a lost env worker's included (its own counter died)
            "flow/rollouts_sent": float(self.plan.store.rollouts_returned + self.rollouts_failed),
        }

    def load_counters(self, counters: dict[str, float]) -> None:
        """Continue counting from a checkpoint's :meth:`counters`."""
        self.env_workers_replaced = int(counters.get("faults/env_workers_replaced", 0))
        self.rollouts_failed = int(counters.get("faults/rollouts_failed", 0))

    def env_failed(self, slot: EnvSlot, exc: BaseException, relaunch: bool) -> None:
        """A call to an env worker (or the evaluator) failed: a bug stops the run; a lost
        peer starts a check that replaces the actor if its worker is gone."""
        if not is_lost(exc):
            who = "the evaluator" if slot.index < 0 else f"env worker {slot.index}"
            raise ApexRuntimeError(f"{who} failed: {type(exc).__name__}: {str(exc).strip()[:200]}")
        if relaunch:
            self.rollouts_failed += 1
        if self.plan.halting or slot.replacing:
            return
        slot.replacing = True
        self.plan.tasks.add(self._check_or_replace(slot), lambda t: self._checked(slot, t))

    async def _check_or_replace(self, slot: EnvSlot) -> bool:
        """Raise if the learner's or a shard's worker is gone; re-create ``slot``'s actor
        if its worker is gone (True); else back off briefly (False)."""
        await self.plan.recovery.check()  # a lost learner or shard is rebuilt first
        info = await self.plan.client.scheduler.identity(n_workers=-1)
        uids = {a: str(w.get("id", "")) for a, w in info.get("workers", {}).items()}
        actors = self.plan.recovery.actors
        uid = ""
        if actors is not None:
            p = actors.placement
            uid = (p.evaluator if slot.index < 0 else p.env_workers[slot.index]).uid
        # the same address may be a worker its nanny restarted, without the actor
        same = slot.address in uids and (not uid or uids[slot.address] == uid)
        if same and slot.future.status == "finished":
            await asyncio.sleep(0.5)  # the actor lives; a peer was slow: retry soon
            return False
        await self.replace_env_worker(slot, info)
        return True

    def _checked(self, slot: EnvSlot, task: asyncio.Future) -> None:
        exc = task.exception()
        if exc is not None:
            raise exc
        slot.replacing = False
        if slot.index < 0:
            return
        if task.result():
            self.env_workers_replaced += 1
        if not self.plan.halting:
            self.plan.store.start(slot)
