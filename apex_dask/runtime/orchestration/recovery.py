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

A lost actor's counters died with it: its last reported flow counters (as
the newest report saw them, ``state.last_shards`` / ``state.last_learner``)
go to ``state.counters.retired`` and are added to the live ones, so the
totals never go backwards; the batches a lost learner had received but not
trained are added to ``flow/batches_lost``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from apex_dask.experiment.checkpoints.store import read_manifest
from apex_dask.experiment.flow import LearnerFlow, ShardFlow
from apex_dask.experiment.results import shard_stat
from apex_dask.runtime.actors.calls import call_with_timeout, tell
from apex_dask.runtime.errors import ApexRuntimeError, describe
from apex_dask.runtime.orchestration.creation import ActorNotCreated
from apex_dask.runtime.orchestration.launch import ActorSet
from apex_dask.runtime.orchestration.placement import WorkerInfo, workers_from_scheduler_info
from apex_dask.runtime.orchestration.state import RunState
from apex_dask.runtime.orchestration.tasks import Job, TaskSet

__all__ = ["Recovery"]


class Recovery(Job):
    """Watches the workers of the learner and the shards; rebuilds lost ones via ``actors``.

    ``latest()`` names the checkpoint to restore from; ``start_learner()``
    starts a rebuilt learner's threads.
    """

    name = "driver.recovery"

    def __init__(
        self,
        state: RunState,
        tasks: TaskSet,
        actors: ActorSet | None,
        *,
        client: Any,
        timeout_s: float,
        latest: Callable[[], Path | None],
        start_learner: Callable[[], Awaitable[None]],
        every_s: float = 1.0,
    ) -> None:
        super().__init__(tasks, every_s)
        self.state, self.actors, self.client, self.timeout = state, actors, client, timeout_s
        self.latest, self.start_learner = latest, start_learner
        self._lock: asyncio.Lock | None = None
        self._learner_retired: str | None = None  # the lost learner whose counters were kept

    def due(self, now: float) -> bool:
        return self.actors is not None and not self.state.halting

    def start(self, now: float) -> Awaitable[bool]:
        return self.check()

    async def check(self) -> bool:
        """Rebuild every actor whose worker is gone; True if one was rebuilt."""
        if self.actors is None:
            return False
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            try:
                ask = self.client.scheduler.identity(n_workers=-1)
                info = await asyncio.wait_for(ask, self.timeout)
            except (OSError, TimeoutError):  # the scheduler itself: the client's to report
                return False
            alive = workers_from_scheduler_info(info)
            self.state.dask_workers = len(alive)
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
            ckpt = self.latest()
            live = self.state.learner if not learner_lost else None
            try:
                parts = read_manifest(ckpt)["parts"] if ckpt is not None else {}
                for k in lost:
                    await self._rebuild_shard(k, alive, ckpt, parts.get(f"shard_{k}"), live)
                if learner_lost:
                    await self._rebuild_learner(alive, ckpt, parts.get("learner"))
            except ActorNotCreated as exc:  # the worker chosen left too: the next check
                self.state.note(f"a lost actor was not rebuilt yet ({exc}); trying again")
                self.soon()
                return False
            except ApexRuntimeError:
                raise
            except Exception as exc:
                raise ApexRuntimeError(
                    f"could not rebuild a lost actor: {describe(exc, 200)}"
                ) from None
            return True

    # -- shards -----------------------------------------------------------------
    async def _rebuild_shard(
        self, k: int, alive: list[WorkerInfo], ckpt: Path | None, entry: dict | None, learner: Any
    ) -> None:
        assert self.actors is not None
        s, placement = self.state, self.actors.placement
        was = placement.shards[k].address
        last = s.last_shards[k] if k < len(s.last_shards) else {}
        if k not in s.missing_shards:  # once per lost shard, however many tries its rebuild takes
            s.counters.retired.retire_shard(ShardFlow.from_shard_metrics(k, last))
        s.shard_lost(k)
        held = {w.address: 0 for w in alive}
        for w in placement.shards:
            if w.address in held:
                held[w.address] += 1
        learner_address = placement.learner.address
        where = next((w for w in alive if w.address == learner_address), None)
        where = where or min(alive, key=lambda w: held[w.address])
        handle = await self.actors.rebuild_shard(k, where)
        added = 0
        if ckpt is not None and entry is not None:
            await call_with_timeout(handle.load_part(str(ckpt), entry), max(self.timeout, 120.0))
            added = await call_with_timeout(handle.added(), self.timeout)
        items = int(shard_stat(last, k, "added"))
        s.counters.faults.replay_items_lost += max(0, items - int(added))
        s.replace_shard(k, handle)
        s.counters.faults.shards_restored += 1
        ref = self.actors.shard_refs[k]  # lost=True: calls waiting on the old one end now
        await self._tell_all("set_shard", k, ref, True, alive=alive, learner=learner)
        source = f"checkpoint {ckpt.name}" if ckpt is not None else "nothing (no checkpoint yet)"
        s.note(f"replay shard {k} was lost with {was}; rebuilt on {where.name} from {source}")

    # -- the learner ------------------------------------------------------------
    async def _rebuild_learner(
        self, alive: list[WorkerInfo], ckpt: Path | None, entry: dict | None
    ) -> None:
        assert self.actors is not None
        s, placement = self.state, self.actors.placement
        was = placement.learner.address
        if self._learner_retired != was:  # once per lost learner
            s.counters.retired.retire_learner(LearnerFlow.from_metrics(s.last_learner))
            self._learner_retired = was
        held = Counter(w.address for w in placement.shards)
        gpu = [w for w in alive if float(w.resources.get("GPU", 0)) > 0]
        where = max(gpu or alive, key=lambda w: held[w.address])
        handle = await self.actors.rebuild_learner(where)
        updates = 0
        if ckpt is not None and entry is not None:
            await call_with_timeout(handle.load_part(str(ckpt), entry), max(self.timeout, 120.0))
            stats = await call_with_timeout(handle.stats(), self.timeout)
            updates = int(stats.get("learner/updates", 0))
        s.replace_learner(handle, where.address, updates)
        s.counters.faults.learner_restored += 1
        if not s.halting:
            await self.start_learner()
        ref = self.actors.learner_ref  # lost=True: pulls waiting on the old one ask the new
        # the relays first: from then on a request naming the lost learner fails at once
        relays = [r.handle for r in s.relays.values() if r.address in {w.address for w in alive}]
        await tell(relays, "set_learner", ref, True, timeout_s=self.timeout)
        await self._tell_all("set_learner", ref, True, alive=alive, learner=None)
        source = f"checkpoint {ckpt.name}" if ckpt is not None else "fresh weights (no checkpoint)"
        s.note(f"the learner was lost with {was}; rebuilt on {where.name} from {source}")

    async def _tell_all(
        self, method: str, *args: Any, alive: list[WorkerInfo], learner: Any
    ) -> None:
        """Call ``method(*args)`` on every env worker on a live worker (and on ``learner``);
        one on a lost worker is replaced later, with the current handles."""
        addresses = {w.address for w in alive}
        targets = [slot.handle for slot in self.state.env_slots() if slot.address in addresses]
        if learner is not None:
            targets.append(learner)
        await tell(targets, method, *args, timeout_s=self.timeout)
