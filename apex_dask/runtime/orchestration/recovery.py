"""Rebuilding a lost replay shard or learner on a surviving worker.

About once a second (and whenever a call fails as if its peer were gone) the
plan asks the scheduler which workers live. For each actor whose worker is gone:

- **a replay shard** is re-created on a surviving worker (the learner's, if
  it lives, else the one holding the fewest shards) and restored from the
  run's newest checkpoint, or left empty without one. Until then env workers
  send their rollouts to the other shards and the learner samples the others
  (its requests to the lost shard fail, counted in ``flow/batches_lost``).
  ``faults/shards_restored`` counts rebuilds, ``faults/replay_items_lost`` the
  items the shard had been given (as of its last stats) that the restored one
  does not hold.
- **the learner** is re-created from the newest checkpoint (fresh weights
  without one) on a surviving worker with a ``GPU`` resource if there is one,
  else on the worker holding the most shards (``faults/learner_restored``).
  Env workers then take its weights whatever their version. The run stops,
  with one line, only when no worker is left.

A lost actor's counters died with it: its last reported ``flow/*`` counters
are kept here and added to the live ones, so the totals never go backwards,
and the batches a lost learner had received but not trained (as of its last
stats) are added to ``flow/batches_lost``.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from apex_dask.algo.checkpoint import read_manifest
from apex_dask.runtime.actors.calls import call_with_timeout
from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.orchestration.placement import WorkerInfo, workers_from_scheduler_info

if TYPE_CHECKING:
    from apex_dask.runtime.orchestration.launch import ActorSet
    from apex_dask.runtime.orchestration.plan import ExecutionPlan

__all__ = ["Recovery"]

_SHARD_FLOW = {
    "rollouts_stored": "flow/rollouts_stored",
    "batches_sampled": "flow/batches_sampled",
    "priority_updates_applied": "flow/priority_updates_applied",
}
_LEARNER_FLOW = (
    "flow/batches_received",
    "flow/batches_trained",
    "flow/priority_updates_sent",
    "flow/priority_updates_failed",
    "flow/batches_lost",
)


class Recovery:
    """Watches the workers of ``plan``'s learner and shards; rebuilds lost ones via ``actors``."""

    def __init__(self, plan: ExecutionPlan, actors: ActorSet | None, every_s: float = 1.0) -> None:
        self.plan, self.actors, self.every_s = plan, actors, every_s
        self.shards_restored = 0
        self.replay_items_lost = 0
        self.learner_restored = 0
        self.retired: Counter[str] = Counter()  # flow counters of lost actors
        self.last_shards: list[dict[str, float]] = []  # set by the report
        self.last_learner: dict[str, Any] = {}
        self._lock: asyncio.Lock | None = None
        self._pending = False
        self._next = 0.0

    # -- counters ---------------------------------------------------------------
    def counters(self) -> dict[str, float]:
        return {
            "faults/shards_restored": float(self.shards_restored),
            "faults/replay_items_lost": float(self.replay_items_lost),
            "faults/learner_restored": float(self.learner_restored),
        }

    def load_counters(self, counters: dict[str, float]) -> None:
        self.shards_restored = int(counters.get("faults/shards_restored", 0))
        self.replay_items_lost = int(counters.get("faults/replay_items_lost", 0))
        self.learner_restored = int(counters.get("faults/learner_restored", 0))

    def add_retired(self, result: dict[str, float]) -> None:
        """Add the lost actors' last counters to ``result``'s ``flow/*`` totals."""
        for name, value in self.retired.items():
            result[name] = result.get(name, 0.0) + float(value)

    # -- watching ---------------------------------------------------------------
    def tick(self) -> None:
        """From the plan's loop: a check about every ``every_s``."""
        now = time.monotonic()
        if self.actors is None or self._pending or now < self._next or self.plan.halting:
            return
        self._pending, self._next = True, now + self.every_s
        self.plan.tasks.add(self.check(), self._checked)

    def soon(self) -> None:
        """A call failed as if its peer were gone: check at the next tick."""
        self._next = 0.0

    def _checked(self, task: asyncio.Future) -> None:
        self._pending = False
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            raise exc

    async def check(self) -> bool:
        """Rebuild every actor whose worker is gone; True if one was rebuilt."""
        if self.actors is None:
            return False
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            try:
                info = await self.plan.client.scheduler.identity(n_workers=-1)
            except (OSError, TimeoutError):  # the scheduler itself: the client's to report
                return False
            alive = workers_from_scheduler_info(info)
            uids = {w.address: w.uid for w in alive}

            def gone(w: WorkerInfo) -> bool:  # not there, or restarted since (same address)
                return w.address not in uids or bool(w.uid and uids[w.address] != w.uid)

            placement = self.actors.placement
            lost = [k for k, w in enumerate(placement.shards) if gone(w)]
            learner_lost = gone(placement.learner)
            if not lost and not learner_lost:
                return False
            if not alive:
                raise ApexRuntimeError("every Dask worker was lost; stopping the run")
            ckpt = self.plan.checkpoints.latest()
            live = self.plan.learner if not learner_lost else None
            try:
                parts = read_manifest(ckpt)["parts"] if ckpt is not None else {}
                for k in lost:
                    await self._rebuild_shard(k, alive, ckpt, parts.get(f"shard_{k}"), live)
                if learner_lost:
                    await self._rebuild_learner(alive, ckpt, parts.get("learner"))
            except ApexRuntimeError:
                raise
            except Exception as exc:
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                raise ApexRuntimeError(
                    f"could not rebuild a lost actor: {type(exc).__name__}: {first}"
                ) from None
            return True

    # -- shards -----------------------------------------------------------------
    async def _rebuild_shard(
        self, k: int, alive: list[WorkerInfo], ckpt: Any, entry: dict | None, learner: Any
    ) -> None:
        assert self.actors is not None
        p, placement = self.plan, self.actors.placement
        was = placement.shards[k].address
        p.missing_shards.add(k)
        last = self.last_shards[k] if k < len(self.last_shards) else {}
        for name, total in _SHARD_FLOW.items():
            self.retired[total] += int(last.get(f"replay/{k}/{name}", 0.0))
        held = {s.address: 0 for s in alive}
        for s in placement.shards:
            if s.address in held:
                held[s.address] += 1
        learner = placement.learner.address
        where = next((w for w in alive if w.address == learner), None)
        where = where or min(alive, key=lambda w: held[w.address])
        handle = await self.actors.rebuild_shard(k, where)
        added = 0
        if ckpt is not None and entry is not None:
            await call_with_timeout(handle.load_part(str(ckpt), entry), max(p.timeout, 120.0))
            added = await call_with_timeout(handle.added(), p.timeout)
        self.replay_items_lost += max(0, int(last.get(f"replay/{k}/added", 0.0)) - int(added))
        p.shards[k] = handle
        self.shards_restored += 1
        ref = self.actors.shard_refs[k]
        await self._tell_all("set_shard", k, ref, alive=alive, learner=learner)
        p.missing_shards.discard(k)
        source = f"checkpoint {ckpt.name}" if ckpt is not None else "nothing (no checkpoint yet)"
        p.report.note(
            f"replay shard {k} was lost with {was}; rebuilt on {where.name} from {source}"
        )

    # -- the learner ------------------------------------------------------------
    async def _rebuild_learner(
        self, alive: list[WorkerInfo], ckpt: Any, entry: dict | None
    ) -> None:
        assert self.actors is not None
        p, placement = self.plan, self.actors.placement
        was = placement.learner.address
        last = self.last_learner
        for name in _LEARNER_FLOW:
            self.retired[name] += int(last.get(name, 0.0))
        # what it had received and not trained (as of its last stats) died with it
        self.retired["flow/batches_lost"] += max(
            0, int(last.get("flow/batches_received", 0)) - int(last.get("flow/batches_trained", 0))
        )
        held = Counter(s.address for s in placement.shards)
        gpu = [w for w in alive if float(w.resources.get("GPU", 0)) > 0]
        where = max(gpu or alive, key=lambda w: held[w.address])
        handle = await self.actors.rebuild_learner(where)
        updates = 0
        if ckpt is not None and entry is not None:
            await call_with_timeout(handle.load_part(str(ckpt), entry), max(p.timeout, 120.0))
            stats = await call_with_timeout(handle.stats(), p.timeout)
            updates = int(stats.get("learner/updates", 0))
        p.learner, p.learner_address = handle, where.address
        p.report.prev_learner = {"learner/updates": float(updates), "learner/grad_total_s": 0.0}
        self.learner_restored += 1
        if not p.halting:
            await p.replay_and_update.start()
        await self._tell_all("set_learner", self.actors.learner_ref, alive=alive, learner=None)
        source = f"checkpoint {ckpt.name}" if ckpt is not None else "fresh weights (no checkpoint)"
        p.report.note(f"the learner was lost with {was}; rebuilt on {where.name} from {source}")

    async def _tell_all(
        self, method: str, *args: Any, alive: list[WorkerInfo], learner: Any
    ) -> None:
        """Call ``method(*args)`` on every env worker on a live worker (and on ``learner``);
        one on a lost worker is replaced later, with the current handles."""
        p = self.plan
        addresses = {w.address for w in alive}
        slots = [*p.slots, *([p.evaluator] if p.evaluator is not None else [])]
        targets = [s.handle for s in slots if s.address in addresses]
        if learner is not None:
            targets.append(learner)

        async def one(h: Any) -> None:
            await call_with_timeout(getattr(h, method)(*args), p.timeout)

        await asyncio.gather(*(one(h) for h in targets), return_exceptions=True)
