"""Elastic runs (``topology.elastic``): env workers follow the Dask workers as they come
and go, and a worker retired on purpose hands its actors over first.

About every half second the job asks the scheduler which workers live and
which are *leaving* (being retired: ``client.retire_workers``, ``cluster.scale``,
``adapt``, ``dask worker --lifetime``; the scheduler holds each retirement until
the run has moved off, :mod:`apex_dask.runtime.observability.handover`). Then:

- **leaving**: its env workers start no new rollout; once their calls in flight
  are stored they are closed (``elastic/env_workers_retired``). A replay shard
  on it is *moved*: a new shard on another worker pulls the old one's snapshot
  straight from it, and the old one forwards every call that still reaches it
  there, so no item is lost (``elastic/shards_moved``, ``elastic/replay_items_moved``).
  The learner is stopped (it trains what it holds and flushes its priorities)
  and a new one continues from its state, a fresh snapshot
  (``elastic/learner_moved``). The evaluator is re-created elsewhere.
- **joined**: the live env workers are topped up to ``workers.per_process`` per
  worker (the learner's excluded while there are others), ``workers.num_workers``
  at most; each takes the next free slot of the fixed epsilon ladder in its fill
  order (both ends, then the widest gaps: the live epsilons span the ladder) and
  the newest weights before its first rollout (``elastic/env_workers_added``). Its
  first stored rollout is one line with the seconds since its worker joined
  (the scheduler's ``add-worker`` event).
- a **weights relay** on a leaving worker is released (it holds nothing but a
  copy); its host's env workers pull from the learner until
  :mod:`.relays` gives the host a new one.

A worker that dies without warning is not seen here: that stays a fault
(:mod:`.faults`, :mod:`.recovery`). Each change is one line in
``state.changes`` (the CLI prints them) and in the placement.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from apex_dask.algo.rollout.exploration import ladder_fill_order
from apex_dask.config import ApexConfig
from apex_dask.experiment.flow import LearnerFlow
from apex_dask.runtime.actors.calls import call_with_timeout, tell
from apex_dask.runtime.errors import ApexRuntimeError, describe
from apex_dask.runtime.orchestration.creation import ActorNotCreated
from apex_dask.runtime.orchestration.launch import ActorSet
from apex_dask.runtime.orchestration.placement import (
    Placement,
    WorkerInfo,
    plan_placement,
    workers_from_scheduler_info,
)
from apex_dask.runtime.orchestration.state import EnvSlot, RunState
from apex_dask.runtime.orchestration.tasks import Job, TaskSet, task_error

__all__ = ["Elasticity", "env_hosts", "free_slots", "install_handover", "start_placement"]


def env_hosts(alive: list[WorkerInfo], learner: str) -> list[WorkerInfo]:
    """The workers that host env workers: all but the learner's, unless it is alone."""
    return [w for w in alive if w.address != learner] or list(alive)


def start_placement(workers: list[WorkerInfo], config: ApexConfig) -> Placement:
    """Where the actors go at the start; an elastic run starts with ``workers.per_process``
    env workers on each worker that hosts them (``workers.num_workers`` at most)."""
    cfg = config

    def place(num_env_workers: int) -> Placement:
        return plan_placement(
            workers,
            num_shards=cfg.replay.num_shards,
            num_env_workers=num_env_workers,
            learner_worker=cfg.topology.learner_worker,
            replay_placement=cfg.replay.placement,
        )

    ceiling = cfg.workers.num_workers
    placement = place(ceiling)
    if not cfg.topology.elastic:
        return placement
    hosts = env_hosts(workers, placement.learner.address)
    n = min(ceiling, cfg.workers.per_process * len(hosts))
    placement = place(n)
    by_slot: list[WorkerInfo | None] = [None] * ceiling  # the first n slots of the fill order
    for i, w in zip(sorted(free_slots(set(), ceiling, n)), placement.env_workers, strict=True):
        by_slot[i] = w
    return replace(placement, env_workers=by_slot)


def install_handover(client: Any) -> None:
    """Have the scheduler hold a retirement until the elastic runs moved off
    (:mod:`apex_dask.runtime.observability.handover`)."""
    from apex_dask.runtime.observability.handover import install

    try:
        client.run_on_scheduler(install)
    except Exception as exc:  # a scheduler that cannot import apex_dask
        raise ApexRuntimeError(
            f"topology.elastic needs apex_dask importable on the scheduler ({describe(exc)}); "
            "install it there or run without --elastic"
        ) from None


def free_slots(used: set[int], ladder_size: int, wanted: int) -> list[int]:
    """The next ``wanted`` slots of the ladder not in ``used``, in the fill order
    (:func:`apex_dask.algo.rollout.exploration.ladder_fill_order`: the live epsilons span the ladder)."""
    return [i for i in ladder_fill_order(ladder_size) if i not in used][: max(0, wanted)]


class Elasticity(Job):
    """Follows the cluster's workers for one elastic run (see the module docstring).

    ``start_env(slot)`` sets a new env worker going (the store's ``start``);
    ``stop_learner()`` / ``start_learner()`` stop and start the learner's replay
    and update; ``evaluating()`` says whether an evaluation is in flight.
    """

    name = "driver.elastic"

    def __init__(
        self,
        state: RunState,
        tasks: TaskSet,
        actors: ActorSet,
        *,
        client: Any,
        run_id: str,
        per_process: int,
        timeout_s: float,
        start_env: Callable[[EnvSlot], None],
        envs_changed: Callable[[], None],
        stop_learner: Callable[[float], Awaitable[dict[str, Any]]],
        start_learner: Callable[[], Awaitable[None]],
        evaluating: Callable[[], bool],
        relays_leaving: Callable[[set[str]], Awaitable[None]] | None = None,
        every_s: float = 0.5,
    ) -> None:
        super().__init__(tasks, every_s)
        self.state, self.actors, self.client, self.run_id = state, actors, client, run_id
        self.per_process, self.timeout = per_process, timeout_s
        self.start_env, self.envs_changed = start_env, envs_changed
        self.stop_learner, self.start_learner = stop_learner, start_learner
        self.evaluating = evaluating
        self.relays_leaving = relays_leaving  # weights relays on leaving workers go first
        p = actors.placement  # the workers the run started on: no joins
        self._known = {w.address for w in [p.learner, p.evaluator, *p.shards, *p.env_workers] if w}
        self._joined: dict[str, float] = {}  # joined since the last fill: address -> wall time
        self._adding: dict[int, str] = {}  # env workers being created: slot index -> address

    def due(self, now: float) -> bool:
        return not self.state.halting

    def start(self, now: float) -> Awaitable[None]:
        return self.check()

    def _ask(self) -> Awaitable[list[str]]:
        """The run's heartbeat to the scheduler; the addresses of the leaving workers."""
        wait_s = max(3 * self.timeout, 180.0)  # a retirement waits at most this for the moves
        ask = self.client.scheduler.apex_handover(run=self.run_id, wait_s=wait_s)
        return asyncio.wait_for(ask, self.timeout)

    async def _beat(self, every_s: float = 1.0) -> None:
        """Keep the heartbeat going while a check is busy (moving actors, starting env
        workers on a joined worker): a retirement meanwhile must still be held."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self._ask()
            except Exception:  # the scheduler's trouble is the client's to report
                pass

    async def check(self) -> None:
        beat = asyncio.create_task(self._beat())
        try:
            await self._check()
        finally:
            beat.cancel()

    async def _check(self) -> None:
        leaving = set(await self._ask())
        info = await asyncio.wait_for(self.client.scheduler.identity(n_workers=-1), self.timeout)
        everyone = workers_from_scheduler_info(info)
        await self._note_joins({w.address for w in everyone})
        alive = [w for w in everyone if w.address not in leaving]
        self.state.dask_workers = len(alive)
        if leaving and alive:
            await self._hand_over(leaving, alive, info)
        if not self.state.halting:
            await self._fill(alive)

    # -- leaving ------------------------------------------------------------------
    async def _hand_over(self, leaving: set[str], alive: list[WorkerInfo], info: Any) -> None:
        s, p = self.state, self.actors.placement
        names = {a: w.get("name", a) for a, w in info.get("workers", {}).items()}
        if self.relays_leaving is not None:  # a relay holds no state: released, not moved
            await self.relays_leaving(leaving)
        for slot in [x for x in s.slots if x.address in leaving]:
            if not slot.retiring:
                slot.retiring = True
                self.envs_changed()
            if slot.in_flight or slot.syncing or slot.replacing:
                continue  # its rollouts in flight are stored first
            await self._retire_env(slot, names.get(slot.address, slot.address))
        for k, w in enumerate(p.shards):
            if w.address in leaving:
                await self._move_shard(k, w, alive)
        if self.actors.placement.learner.address in leaving:
            await self._move_learner(alive)
        ev = s.evaluator
        if ev is not None and ev.address in leaving and not self.evaluating():
            was, old = names.get(ev.address, ev.address), ev.future
            kept = {a: w for a, w in info["workers"].items() if a not in leaving}
            try:
                ev.rebind(*await self.actors.replace_env_worker(ev, {**info, "workers": kept}))
            except ActorNotCreated as exc:  # the worker chosen left too: the next check retries
                s.note(f"the evaluator was not moved off leaving Dask worker {was}: {exc}")
                return
            await self.actors.retire(old)
            s.change(f"the evaluator moved off leaving Dask worker {was} to {ev.address}")

    async def _retire_env(self, slot: EnvSlot, name: str) -> None:
        s = self.state
        try:
            await call_with_timeout(slot.handle.close(), min(self.timeout, 10.0))
        except Exception:  # it goes with its worker anyway
            pass
        await self.actors.retire(slot.future)
        self.actors.placement = self.actors.placement.moved(slot.index, None)
        s.remove_slot(slot)
        s.counters.elastic.env_workers_retired += 1
        self.envs_changed()
        s.change(f"env worker {slot.index} retired with its leaving Dask worker {name}")

    async def _move_shard(self, k: int, was: WorkerInfo, alive: list[WorkerInfo]) -> None:
        s, actors = self.state, self.actors
        learner = actors.placement.learner.address
        held = Counter(w.address for w in actors.placement.shards)
        dest = next((w for w in alive if w.address == learner), None)
        dest = dest or min(alive, key=lambda w: held[w.address])
        s.shard_lost(k)  # new rollouts go to the other shards meanwhile
        old_handle = s.shards[k]
        new, new_ref, old_fut = await actors.move_shard(k, dest)
        old_ref = actors.ref(old_fut)
        before, after = await call_with_timeout(
            new.take_over(old_ref, new_ref), max(self.timeout, 120.0)
        )
        await self._tell_all("set_shard", k, new_ref, learner=s.learner)
        s.replace_shard(k, new)
        await self._quiet(old_handle)  # calls already on their way are forwarded
        await actors.retire(old_fut)
        s.counters.elastic.shards_moved += 1
        s.counters.elastic.replay_items_moved += int(after)
        s.change(
            f"replay shard {k} moved off leaving Dask worker {was.name} to {dest.name}: "
            f"{before} items held before the move, {after} after"
        )

    async def _quiet(self, old: Any, quiet_s: float = 0.5) -> None:
        """Wait (bounded) until no call has reached the handed-over shard for ``quiet_s``."""
        deadline = time.monotonic() + min(self.timeout, 10.0)
        while time.monotonic() < deadline:
            try:
                idle = await call_with_timeout(old.idle_s(), self.timeout)
            except Exception:
                return
            if idle >= quiet_s:
                return
            await asyncio.sleep(quiet_s - idle)

    async def _move_learner(self, alive: list[WorkerInfo]) -> None:
        s, actors = self.state, self.actors
        was = actors.placement.learner
        held = Counter(w.address for w in actors.placement.shards)
        gpu = [w for w in alive if float(w.resources.get("GPU", 0)) > 0]
        dest = max(gpu or alive, key=lambda w: held[w.address])
        final = await self.stop_learner(max(self.timeout, 120.0))  # trains what it holds
        s.counters.retired.retire_learner(LearnerFlow.from_metrics(final))
        new, old_fut = await actors.move_learner(dest)
        version = await call_with_timeout(
            new.take_over(actors.ref(old_fut)), max(self.timeout, 120.0)
        )
        s.replace_learner(new, dest.address, int(final.get("learner/updates", 0)))
        s.last_learner = {}
        if not s.halting:
            await self.start_learner()
        relays = [r.handle for r in s.relays.values()]  # first: they follow the new one
        await tell(relays, "set_learner", actors.learner_ref, timeout_s=self.timeout)
        await self._tell_all("set_learner", actors.learner_ref, learner=None)
        await actors.retire(old_fut)
        s.counters.elastic.learner_moved += 1
        s.change(
            f"the learner moved off leaving Dask worker {was.name} to {dest.name} "
            f"(weights version {version}, from a fresh snapshot)"
        )

    async def _tell_all(self, method: str, *args: Any, learner: Any) -> None:
        targets = [slot.handle for slot in self.state.env_slots()]
        if learner is not None:
            targets.append(learner)
        await tell(targets, method, *args, timeout_s=self.timeout)

    # -- joined -------------------------------------------------------------------
    async def _note_joins(self, addresses: set[str]) -> None:
        """Remember when each worker new since the last check joined (the scheduler's
        ``add-worker`` event; the workers holding actors at the start are no joins)."""
        for a in addresses - self._known:
            self._joined[a] = await self._join_time(a)
        self._known |= addresses

    async def _join_time(self, address: str) -> float:
        try:
            ask = self.client.scheduler.events(topic=address)
            events = await asyncio.wait_for(ask, min(self.timeout, 10.0))
            joins = [float(t) for t, msg in events if dict(msg).get("action") == "add-worker"]
            if joins:
                return joins[-1]
        except Exception:  # an older scheduler: when this check saw it
            pass
        return time.time()

    async def _fill(self, alive: list[WorkerInfo]) -> None:
        """Start creating the env workers the live workers lack; each is started when it
        exists (:meth:`_added`), so a check never waits on a new worker's start-up."""
        s, actors = self.state, self.actors
        joined, self._joined = self._joined, {}  # env workers on these time their first rollout
        hosts = env_hosts(alive, actors.placement.learner.address)
        ladder = len(actors.ladder())
        live = [x for x in s.slots if not x.retiring]
        wanted = min(ladder, self.per_process * len(hosts)) - len(live) - len(self._adding)
        indices = free_slots({x.index for x in s.slots} | set(self._adding), ladder, wanted)
        load = Counter(x.address for x in live) + Counter(self._adding.values())
        for i in indices:
            where = min(hosts, key=lambda w: load[w.address])
            load[where.address] += 1
            self._adding[i] = where.address
            joined_at = joined.get(where.address)
            self.tasks.add(
                actors.add_env_worker(i, where),
                lambda task, i=i, where=where, j=joined_at: self._added(i, where, j, task),
            )

    def _added(self, i: int, where: WorkerInfo, joined_at: float | None, task: Any) -> None:
        s = self.state
        self._adding.pop(i, None)
        exc = task_error(task)
        if exc is not None:
            if not isinstance(exc, asyncio.CancelledError):  # cancelled: the run ended
                s.note(f"could not add env worker {i} on {where.name}: {describe(exc)}")
            return
        slot: EnvSlot = task.result()
        slot.joined_at = joined_at
        since = "" if joined_at is None else f", {time.time() - joined_at:.1f} s after it joined"
        s.add_slot(slot)
        s.counters.elastic.env_workers_added += 1
        s.change(
            f"env worker {i} (exploration {slot.exploration:.4g}) added on Dask worker {where.name}{since}"
        )
        if not s.halting:
            self.start_env(slot)
        self.envs_changed()
