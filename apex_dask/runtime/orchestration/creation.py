"""Waiting for a new actor to exist, bounded, and not for an actor whose worker left.

An actor is pinned to one worker (``workers=[address]``). If that worker
leaves before the actor exists, the scheduler holds the creation until the
worker comes back, which a worker restarted by its nanny never does at the
same address (nor as the same process): an unbounded wait on it never ends.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.orchestration.placement import WorkerInfo

__all__ = ["ActorNotCreated", "created", "still_there"]


class ActorNotCreated(ApexRuntimeError):
    """An actor was not created where it was placed: its worker left meanwhile, or the
    creation did not finish in time. Nothing else changed: the caller may try again
    elsewhere."""


def _name(where: WorkerInfo | None) -> str:
    return "its worker" if where is None else f"Dask worker {where.name or where.address}"


async def created(client: Any, fut: Any, where: WorkerInfo | None, limit_s: float) -> None:
    """Wait until the actor of ``fut`` exists: at most ``limit_s``, and while it waits
    check about once a second that ``where`` is still there. Raises
    :class:`ActorNotCreated`, or the creation's own error."""
    deadline = time.monotonic() + limit_s
    waiter = asyncio.ensure_future(client.gather(fut, asynchronous=True))
    try:
        while True:
            left = deadline - time.monotonic()
            done, _ = await asyncio.wait([waiter], timeout=max(0.0, min(1.0, left)))
            if done:
                waiter.result()
                return
            if left <= 1.0:
                raise ActorNotCreated(
                    f"an actor on {_name(where)} was not created in {limit_s:g} s"
                )
            if where is not None and not await still_there(client, where, min(limit_s, 10.0)):
                raise ActorNotCreated(f"{_name(where)} left while an actor was being created on it")
    finally:
        waiter.cancel()


async def still_there(client: Any, where: WorkerInfo, timeout_s: float) -> bool:
    """Whether the scheduler still lists ``where``, as the same process (a worker its
    nanny restarted at the same address holds none of its actors); True when the
    scheduler does not answer within ``timeout_s`` (its trouble is the client's)."""
    try:
        info = await asyncio.wait_for(client.scheduler.identity(n_workers=-1), timeout_s)
    except Exception:
        return True
    w = (info.get("workers") or {}).get(where.address)
    return w is not None and (not where.uid or str(w.get("id", "")) == where.uid)
