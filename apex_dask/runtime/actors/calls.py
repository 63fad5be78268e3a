"""Small helpers for actor calls: timeouts and rate-limited metric publishing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from apex_dask.runtime.observability.metrics import MetricsPublisher, actor_names

__all__ = [
    "ActorRef",
    "until_released",
    "actor_key",
    "PeerCalls",
    "PeerReplaced",
    "Throttled",
    "as_handle",
    "bind",
    "call_with_timeout",
    "current_worker",
    "local_actor",
    "peer_lost",
    "tell",
]

# (class, worker address, key): names an actor without making its key a dependency.
# Actors are created with refs rather than Futures: an actor created with another's
# Future depends on its key, and when that actor is lost the scheduler errs (and
# releases) every actor created with it.
ActorRef = tuple


def as_handle(ref: Any) -> Any:
    """An actor handle from an :data:`ActorRef` (a handle is returned unchanged)."""
    if isinstance(ref, tuple):
        from distributed.actor import Actor

        return Actor(*ref)
    return ref


def actor_key(handle: Any) -> Any:
    """What names one actor: its Dask key (the object itself, by id, for an actor in
    this process)."""
    return getattr(handle, "key", None) or id(handle)


def bind(ref: ActorRef, client: Any) -> Any:
    """A handle to the actor ``ref`` names, bound to ``client`` (not to whatever client
    is the default in this thread)."""
    from distributed.actor import Actor

    with client.as_current():
        return Actor(*ref)


def current_worker() -> Any | None:
    """The Dask worker running this code (None outside one, e.g. actors in a test)."""
    from distributed import get_worker

    try:
        return get_worker()
    except ValueError:
        return None


def local_actor(handle: Any, worker: Any) -> Any | None:
    """The actor object ``handle`` names if it lives on ``worker`` (else None).

    With :func:`same_host`, the one place that reads a handle's private ``_address``
    (Dask offers no public way to ask where an actor lives).
    """
    if getattr(handle, "_address", None) != worker.address:
        return None
    return worker.state.actors.get(handle.key)


def same_host(handle: Any, worker: Any) -> bool:
    """Whether the actor ``handle`` names lives on ``worker``'s host (by address)."""
    from distributed.comm import get_address_host

    address = getattr(handle, "_address", None)
    return address is not None and get_address_host(address) == get_address_host(worker.address)


# Dask's text when a handle's worker is gone: a plain RuntimeError, the one untyped case
_LOST_TEXT = "Worker holding Actor was lost"


def peer_lost(exc: BaseException) -> bool:
    """True if a failed actor call means its peer (the worker holding it) is gone or
    did not answer in time, rather than a bug in the called method.

    Dask raises ``OSError`` (``CommClosedError``, "Unable to contact Actor's worker")
    when it cannot reach the worker, our timeouts raise ``TimeoutError``; only a handle
    whose actor's Future has erred raises an untyped ``RuntimeError``, recognised by
    its text. The same error from a peer's own call to a lost actor arrives re-raised
    with its type and text, so it is recognised too.
    """
    if isinstance(exc, OSError | TimeoutError):
        return True
    return isinstance(exc, RuntimeError) and _LOST_TEXT in str(exc)


T = TypeVar("T")


async def call_with_timeout(fut: Awaitable[T], timeout_s: float) -> T:
    """Await an ActorFuture (or any awaitable); ``TimeoutError`` after ``timeout_s``.

    A call to an actor whose worker died never resolves when made from another
    actor, so every actor-to-actor call goes through here.
    """

    async def _wait() -> T:
        return await fut

    return await asyncio.wait_for(_wait(), timeout_s)


async def tell(handles: list[Any], method: str, *args: Any, timeout_s: float) -> None:
    """``method(*args)`` on each actor of ``handles``, together, each within ``timeout_s``;
    a call that fails is left to the checks that replace lost actors."""

    async def one(h: Any) -> None:
        await call_with_timeout(getattr(h, method)(*args), timeout_s)

    await asyncio.gather(*(one(h) for h in handles), return_exceptions=True)


class PeerReplaced(ConnectionError):
    """A call in flight to a peer that was replaced (its worker was lost and the actor
    rebuilt elsewhere): it was given up at once rather than left to its timeout. An
    ``OSError``, so :func:`peer_lost` counts it as a lost peer."""


class PeerCalls:
    """Calls in flight to peers, by peer key (e.g. ``("shard", 3)`` or ``"learner"``).

    A call to an actor whose worker died never resolves when made from another
    actor: it waits out its whole timeout (``topology.call_timeout_s``, 60 s by
    default). When the driver says the peer was rebuilt (:meth:`replaced`), the calls
    still waiting on the lost one end at once with :class:`PeerReplaced`, so their
    callers move to the new actor now::

        calls = PeerCalls()
        batch = await calls.call(("shard", k), shard.sample(), timeout_s)  # any task
        calls.replaced(("shard", k))       # set_shard(k, new, lost=True): callers go on
    """

    def __init__(self) -> None:
        self._calls: dict[Any, set[asyncio.Future]] = {}

    async def call(self, key: Any, fut: Awaitable[T], timeout_s: float) -> T:
        """``await fut`` with ``timeout_s`` (``TimeoutError``); :class:`PeerReplaced` if peer
        ``key`` is replaced meanwhile."""
        task = asyncio.ensure_future(call_with_timeout(fut, timeout_s))
        calls = self._calls.setdefault(key, set())
        calls.add(task)
        try:
            await asyncio.wait([task])
        finally:
            calls.discard(task)
            if not task.done():  # the caller itself was cancelled
                task.cancel()
        if task.cancelled():
            raise PeerReplaced(f"{key} was replaced while a call to it was in flight")
        return task.result()

    def in_flight(self, key: Any) -> int:
        """Calls to peer ``key`` in flight now."""
        return len(self._calls.get(key, ()))

    def replaced(self, key: Any) -> int:
        """Peer ``key`` was lost and rebuilt: its calls in flight end now; how many."""
        calls = self._calls.pop(key, set())
        for task in calls:
            task.cancel()
        return len(calls)


async def until_released(
    obj: Any, worker: Any, every_s: float = 2.0, tick: Callable[[], None] = lambda: None
) -> None:
    """Return once ``obj``, an actor that was registered on Dask ``worker``, is no longer
    one of its actors: Dask deleted it because its driver released it or died (a
    SIGKILLed driver's client is dropped by the scheduler). The actor's own threads and
    tasks would otherwise run on, orphaned, until the worker process ends. ``tick()`` runs
    at each look (a supervised task's failpoint)."""
    seen = False
    while True:
        tick()
        here = any(a is obj for a in worker.state.actors.values())
        if seen and not here:
            return
        seen = seen or here
        await asyncio.sleep(every_s)


class Throttled:
    """A :class:`MetricsPublisher` that builds the metrics dict only when one is due.

    ``maybe(make)`` calls ``make()`` and publishes its result at most once per
    ``min_interval_s``; ``now(make)`` publishes at once (e.g. on close). The actor's own
    names only: the run totals are the driver's (:func:`actor_names`).
    """

    def __init__(self, source: str, run: str, min_interval_s: float = 1.0) -> None:
        self.publisher = MetricsPublisher(source, run=run, min_interval_s=min_interval_s)
        self._interval = float(min_interval_s)
        self._last = -float("inf")

    def maybe(self, make: Callable[[], dict[str, float]]) -> None:
        now = time.monotonic()
        if now - self._last >= self._interval:
            self._last = now
            self.publisher.publish(actor_names(make()), force=True)

    def now(self, make: Callable[[], dict[str, float]]) -> None:
        self._last = time.monotonic()
        self.publisher.publish(actor_names(make()), force=True)
