"""On the scheduler: a Dask worker retired on purpose waits while elastic runs move off it.

Dask refuses to retire a worker that holds actors (its ``RetireWorker`` policy
gives up at once), and the callers that retire a worker then close it anyway:
``cluster.scale(n)`` and ``adapt`` (``SpecCluster`` closes the worker after
asking), ``dask worker --lifetime`` (``Worker.close_gracefully``). So the actors
of such a worker die with it. Every one of those callers goes through the
scheduler's ``retire_workers`` handler first; :func:`install` wraps it::

    client.run_on_scheduler(install)         # the driver of an elastic run does this
    leaving = await client.scheduler.apex_handover(run=run_id, wait_s=120)

While an elastic run's driver has called ``apex_handover`` within the last
:data:`HEARTBEAT_S` seconds, a retirement first records the workers as
*leaving* (``apex_handover`` answers their addresses) and waits until they hold
no actor any more (the driver moved them) or ``wait_s`` has passed, then
retires them as Dask would. Without an elastic run nothing changes. A worker
that dies without warning never passes through here: that stays a fault.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed import Scheduler

__all__ = ["HEARTBEAT_S", "Handover", "install"]

HEARTBEAT_S = 10.0
"""An elastic run whose driver has not asked for this long is no longer waited for."""

_CLOSE_KWARGS = ("memory_ratio", "n", "key", "minimum", "target", "attribute")


class Handover:
    """The scheduler's leaving workers and the elastic runs that move actors off them."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.runs: dict[str, tuple[float, float]] = {}  # run id -> (last ask, wait_s)
        self.leaving: dict[str, float] = {}  # worker address -> since (monotonic)
        self.retire = scheduler.handlers["retire_workers"]
        scheduler.handlers["retire_workers"] = self.retire_workers
        scheduler.handlers["apex_handover"] = self.ask

    def ask(self, run: str = "", wait_s: float = 120.0) -> list[str]:
        """A driver's heartbeat: the addresses of the workers leaving now."""
        self.runs[run] = (time.monotonic(), float(wait_s))
        return sorted(self.leaving)

    def wait_s(self) -> float:
        """How long a retirement waits: the longest of the live runs' (0: none is live)."""
        now = time.monotonic()
        live = [w for t, w in self.runs.values() if now - t <= HEARTBEAT_S]
        return max(live, default=0.0)

    def _targets(self, workers: Any, names: Any, kwargs: dict[str, Any]) -> list[str]:
        s = self.scheduler
        given = names if names is not None else workers
        if given is not None:  # SpecCluster.scale passes names as ``workers``: take both
            wanted = {str(n) for n in given}
            return [a for a, ws in s.workers.items() if a in wanted or str(ws.name) in wanted]
        close = {k: kwargs.pop(k) for k in _CLOSE_KWARGS if k in kwargs}
        return list(s.workers_to_close(**close))

    def _holds_actors(self, addresses: list[str]) -> bool:
        return any(
            (ws := self.scheduler.workers.get(a)) is not None and ws.actors for a in addresses
        )

    async def retire_workers(self, workers: Any = None, *, names: Any = None, **kwargs: Any) -> Any:
        """Dask's ``retire_workers``, after the elastic runs moved their actors off."""
        wait_s = self.wait_s()
        if wait_s <= 0:  # no elastic run: exactly as before
            return await self.retire(workers=workers, names=names, **kwargs)
        targets = self._targets(workers, names, kwargs)
        for a in targets:
            self.leaving.setdefault(a, time.monotonic())
        try:
            deadline = time.monotonic() + wait_s
            while self._holds_actors(targets) and time.monotonic() < deadline:
                if self.wait_s() <= 0:  # the runs ended meanwhile
                    break
                await asyncio.sleep(0.1)
            return await self.retire(workers=targets, **kwargs)
        finally:
            for a in targets:
                self.leaving.pop(a, None)


def install(dask_scheduler: Scheduler) -> bool:
    """Wrap the scheduler's ``retire_workers`` and add ``apex_handover`` (idempotent)."""
    if getattr(dask_scheduler, "_apex_handover", None) is None:
        dask_scheduler._apex_handover = Handover(dask_scheduler)  # type: ignore[attr-defined]
    return True
