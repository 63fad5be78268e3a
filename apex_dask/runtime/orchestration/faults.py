"""What the plan does when a call to an env worker (or the evaluator) fails.

- A bug (a method failed) stops the run with one line; so does an env error the
  env worker did not survive (:class:`~apex_dask.algo.envs.guard.EnvFailed`:
  restarts off, or over ``workers.max_env_errors_per_1k_steps`` or
  ``workers.max_consecutive_env_errors``).
- A lost peer (the Dask worker holding the actor died, or a call timed out;
  :func:`~apex_dask.runtime.actors.calls.peer_lost`) starts a check: a lost
  learner or shard is rebuilt first (:mod:`.recovery`); if the env worker's
  own worker is gone it is re-created on a surviving worker
  (``faults/env_workers_replaced``) and its rollouts start again; otherwise
  the peer was only slow and is retried. If the worker chosen for the new
  actor leaves before the actor exists, the check ends (one note) and the
  next failed call starts another, which picks among the workers left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from apex_dask.algo.envs.guard import EnvFailed
from apex_dask.runtime.actors.calls import peer_lost
from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.orchestration.creation import ActorNotCreated
from apex_dask.runtime.orchestration.launch import ActorSet
from apex_dask.runtime.orchestration.state import EnvSlot, RunState
from apex_dask.runtime.orchestration.tasks import TaskSet

__all__ = ["FaultHandler"]


class FaultHandler:
    """Checks and replaces env workers; ``check_rebuilds()`` (the recovery's ``check``)
    rebuilds a lost learner or shard first. The caller that reports a failure says how
    its worker starts again once replaced (``restart``: the store's ``start``; the
    evaluator, called when it is next due, gives none)."""

    def __init__(
        self,
        state: RunState,
        tasks: TaskSet,
        actors: ActorSet | None,
        *,
        client: Any,
        check_rebuilds: Callable[[], Awaitable[bool]],
        timeout_s: float = 60.0,
    ) -> None:
        self.state, self.tasks, self.actors, self.client = state, tasks, actors, client
        self.timeout = float(timeout_s)
        self.check_rebuilds = check_rebuilds

    def env_failed(
        self,
        slot: EnvSlot,
        exc: BaseException,
        relaunch: bool,
        restart: Callable[[EnvSlot], None] | None = None,
    ) -> None:
        """A call to an env worker (or the evaluator) failed: a bug stops the run; a lost
        peer starts a check that replaces the actor if its worker is gone, then
        ``restart(slot)`` sets it going again (``relaunch``: the failed call was a
        rollout, counted in ``faults/rollouts_failed``)."""
        if isinstance(exc, EnvFailed):  # its line names the env, the error and the worker
            for line in exc.warnings:  # the CLI routes py.warnings to the run's log
                who = "the evaluator" if slot.index < 0 else f"env worker {slot.index}"
                logging.getLogger("py.warnings").warning("%s: %s", who, line)
            raise ApexRuntimeError(" ".join(str(exc).split())[:400])
        if not peer_lost(exc):
            who = "the evaluator" if slot.index < 0 else f"env worker {slot.index}"
            raise ApexRuntimeError(f"{who} failed: {type(exc).__name__}: {str(exc).strip()[:200]}")
        if relaunch:
            self.state.counters.faults.rollouts_failed += 1
        if self.state.halting or slot.replacing:
            return
        slot.replacing = True
        self.tasks.add(self._check_or_replace(slot), lambda t: self._checked(slot, t, restart))

    async def _check_or_replace(self, slot: EnvSlot) -> bool:
        """Raise if the learner's or a shard's worker is gone; re-create ``slot``'s actor
        if its worker is gone (True); else back off briefly (False)."""
        await self.check_rebuilds()  # a lost learner or shard is rebuilt first
        if self.actors is None:
            who = "the evaluator" if slot.index < 0 else f"env worker {slot.index}"
            raise ApexRuntimeError(f"{who} did not answer and cannot be replaced here")
        info = await asyncio.wait_for(self.client.scheduler.identity(n_workers=-1), self.timeout)
        uids = {a: str(w.get("id", "")) for a, w in info.get("workers", {}).items()}
        uid = self.actors.placement.env_worker(slot.index).uid
        # the same address may be a worker its nanny restarted, without the actor
        same = slot.address in uids and (not uid or uids[slot.address] == uid)
        if same and slot.future.status == "finished":
            await asyncio.sleep(0.5)  # the actor lives; a peer was slow: retry soon
            return False
        try:
            slot.rebind(*await self.actors.replace_env_worker(slot, info))
        except ActorNotCreated as exc:  # e.g. the worker chosen left meanwhile: try again
            who = "the evaluator" if slot.index < 0 else f"env worker {slot.index}"
            self.state.note(f"{who} was not re-created ({exc}); trying another worker")
            return False
        return True

    def _checked(
        self, slot: EnvSlot, task: asyncio.Future, restart: Callable[[EnvSlot], None] | None
    ) -> None:
        exc = task.exception()
        if exc is not None:
            raise exc
        slot.replacing = False
        if slot.index < 0:
            return
        if task.result():
            self.state.counters.faults.env_workers_replaced += 1
        if not self.state.halting and restart is not None:
            restart(slot)
