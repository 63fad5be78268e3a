"""One weights relay per host with env workers (``topology.weight_relays``).

About once a second the job compares the relays with the env workers alive:

- a host whose env workers have no relay gets one, on the worker there that
  holds the most env workers (never the learner's own worker: its env workers
  pull from the learner in-process), and each of its env workers is told
  (``set_relay``); an env worker replaced or added later is told at the next check;
- a relay whose worker is gone (lost, or retired in an elastic run) is dropped
  and its env workers are told at once (``set_relay(None, lost=True)``: a pull
  waiting on it goes to the learner now); the host gets a new relay in the same
  check when a worker there still holds env workers;
- a relay whose host has no env workers left is released;
- a new learner (rebuilt or handed over) is passed on to every relay with
  ``lost=True``, so an ask still waiting on the old one ends now.

Until its relay exists, and whenever a relay call fails, an env worker pulls
from the learner itself: the relay saves bytes, it is never needed for a sync.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable
from typing import Any

from apex_dask.runtime.actors.calls import actor_key, tell
from apex_dask.runtime.orchestration.creation import ActorNotCreated
from apex_dask.runtime.orchestration.launch import ActorSet
from apex_dask.runtime.orchestration.placement import WorkerInfo, workers_from_scheduler_info
from apex_dask.runtime.orchestration.state import RelaySlot, RunState
from apex_dask.runtime.orchestration.tasks import Job, TaskSet

__all__ = ["WeightRelays", "host_of"]


def host_of(address: str) -> str:
    """The host part of a worker address (``tcp://198.18.0.2:4321`` -> ``198.18.0.2``)."""
    from distributed.comm import get_address_host

    return get_address_host(address)


class WeightRelays(Job):
    """Keeps one relay per host with env workers (see the module docstring); supervised as
    ``driver.relays`` (restart: env workers pull from the learner meanwhile)."""

    name = "driver.relays"

    def __init__(
        self,
        state: RunState,
        tasks: TaskSet,
        actors: ActorSet | None,
        *,
        client: Any,
        timeout_s: float,
        every_s: float = 1.0,
    ) -> None:
        super().__init__(tasks, every_s)
        self.state, self.actors, self.client, self.timeout = state, actors, client, timeout_s
        self._told: dict[Any, Any] = {}  # env worker actor key -> relay key it was given
        self._learner_key: Any = None
        self.lost = 0  # relays whose worker was gone (a count for the notes)

    def due(self, now: float) -> bool:
        return self.actors is not None and not self.state.halting

    def start(self, now: float) -> Awaitable[None]:
        return self.check()

    async def check(self) -> None:
        assert self.actors is not None
        s = self.state
        try:
            info = await asyncio.wait_for(
                self.client.scheduler.identity(n_workers=-1), self.timeout
            )
        except (OSError, TimeoutError):  # the scheduler itself: the client's to report
            return
        alive = {w.address: w for w in workers_from_scheduler_info(info)}
        learner_address = s.learner_address
        by_host: dict[str, list[Any]] = {}
        for slot in s.env_slots():
            if slot.replacing or slot.retiring or slot.address not in alive:
                continue
            if slot.address == learner_address:  # pulls from the learner in-process
                continue
            by_host.setdefault(host_of(slot.address), []).append(slot)
        for host, relay in list(s.relays.items()):
            gone = relay.address not in alive
            if gone or host not in by_host:
                await self._drop(relay, gone)
        learner_key = actor_key(s.learner)
        if learner_key != self._learner_key:
            if self._learner_key is not None:
                ref = self.actors.learner_ref
                await self._tell([r.handle for r in s.relays.values()], "set_learner", ref, True)
            self._learner_key = learner_key
        for host, slots in by_host.items():
            relay = s.relays.get(host)
            if relay is None:
                relay = await self._add(host, slots, alive)
                if relay is None:
                    continue
            todo = [x for x in slots if self._told.get(actor_key(x.handle)) != relay.key]
            if todo:
                await self._tell([x.handle for x in todo], "set_relay", relay.ref)
                for x in todo:
                    self._told[actor_key(x.handle)] = relay.key
        live = {actor_key(x.handle) for x in s.env_slots()}
        self._told = {k: v for k, v in self._told.items() if k in live}

    async def leave(self, leaving: set[str]) -> None:
        """Release the relays on ``leaving`` workers (an elastic retirement waits until
        the worker holds no actor); their env workers pull from the learner meanwhile."""
        for relay in [r for r in self.state.relays.values() if r.address in leaving]:
            await self._drop(relay, True, lost=False)

    async def _add(
        self, host: str, slots: list[Any], alive: dict[str, WorkerInfo]
    ) -> RelaySlot | None:
        assert self.actors is not None
        held = Counter(x.address for x in slots)
        where = alive[max(held, key=lambda a: (held[a], a))]
        try:
            fut, handle, ref = await self.actors.add_relay(host, where)
        except ActorNotCreated:  # its worker left meanwhile: the next check
            return None
        relay = RelaySlot(host, fut, handle, ref, where.address)
        self.state.relays[host] = relay
        return relay

    async def _drop(self, relay: RelaySlot, gone: bool, lost: bool = True) -> None:
        """Forget ``relay``; ``gone``: its worker left (``lost``: without warning), its env
        workers stop waiting on it."""
        assert self.actors is not None
        s = self.state
        s.relays.pop(relay.host, None)
        if gone and lost:
            self.lost += 1
            s.note(f"the weights relay on {relay.host} was lost; its env workers pull directly")
        users = [x for x in s.env_slots() if self._told.get(actor_key(x.handle)) == relay.key]
        await self._tell([x.handle for x in users], "set_relay", None, gone)
        for x in users:
            self._told.pop(actor_key(x.handle), None)
        await self.actors.retire(relay.future)

    async def _tell(self, handles: list[Any], method: str, *args: Any) -> None:
        await tell(handles, method, *args, timeout_s=self.timeout)
