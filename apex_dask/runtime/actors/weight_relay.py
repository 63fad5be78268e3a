"""The weights relay: one per host with env workers, so a weights version leaves the
learner's process once per host rather than once per env worker.

::

    learner --(one blob per version)--> relay on host h --> env workers on host h

An env worker asks its host's relay exactly what it would ask the learner
(``weights_if_newer(version, learner)``, with the learner it follows). The
relay answers from its copy only if it asked the learner *after* the request
arrived; otherwise it asks the learner first (``versioned_weights_if_newer``:
None when nothing is newer, the blob once per version). Requests that arrive
together share one ask. So an env worker gets what a pull from the learner at
that moment would give, at least the learner's version when it asked: the
meaning of ``sync/policy_lag`` and ``workers.max_weight_sync_delay`` is kept.
With ``topology.weight_relay_max_age_s`` = ``a`` > 0 an ask that began at most
``a`` seconds before the request arrived answers it too: the relay asks the
learner at most about once per ``a`` seconds, and an env worker's version may
trail the learner's at its sync by the versions made in ``a`` seconds.
A request naming another learner (a rebuilt or handed-over one) drops the copy
and follows the new learner; an ask still waiting on the old one ends at once
(its requests fail, their env workers pull from the learner they follow), since
a call to an actor whose worker died never answers and the ask holds the relay.
A learner left behind is never followed again: requests still queued for it,
and later ones (an env worker not yet told of the rebuild), fail at once rather
than ask it. The driver names the new learner to the relays
(:meth:`WeightRelayActor.set_learner`) before it tells the env workers.

Counters (``relay/<host>/*``, the ``relays`` law of
:mod:`~apex_dask.runtime.orchestration.invariants`): ``requests`` = ``served``
(a newer blob handed out) + ``current`` (nothing newer) + ``failed`` (the ask
to the learner failed: the env worker pulls from the learner itself) +
``in_flight``; ``blobs_in`` / ``bytes_in`` the blobs taken from the learner,
``repeat_blobs`` a blob taken for a version already held (the law holds it at 0:
each version is fetched once), ``version`` the version held.

A lost relay costs nothing but its copy: an env worker whose relay call fails
pulls from the learner (``env/<i>/relay_fallbacks``), and the driver's
:class:`~apex_dask.runtime.orchestration.relays.WeightRelays` gives the host a
new relay.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from apex_dask.runtime.actors.calls import (
    ActorRef,
    PeerCalls,
    as_handle,
    current_worker,
    until_released,
)
from apex_dask.runtime.actors.failpoints import InjectedFault, failpoint
from apex_dask.runtime.actors.supervision import TaskFailures, start_supervised

__all__ = ["StaleLearner", "WeightRelayActor", "relay_prefix"]


class StaleLearner(ConnectionError):
    """A request named a learner the driver has replaced (an ``OSError``: the env worker
    pulls from the learner it follows, as for any failed relay call)."""


def _learner_key(learner: Any) -> Any:
    """What names a learner in a request: its Dask key (by id for one in this process)."""
    return learner[2] if isinstance(learner, tuple) else id(learner)


def relay_prefix(host: str) -> str:
    """The metric prefix of the relay on ``host``: ``relay/<host>/``."""
    return f"relay/{host}/"


class WeightRelayActor:
    """The weights relay of the env workers on ``host`` (see the module docstring)."""

    def __init__(self, host: str, *, call_timeout_s: float = 60.0, max_age_s: float = 0.0) -> None:
        self.host = str(host)
        self._timeout = float(call_timeout_s)
        self._max_age = max(0.0, float(max_age_s))
        self._calls = PeerCalls()
        self._dask_worker = current_worker()
        self.failures = TaskFailures(f"the weights relay on {self.host}")
        self._orphan_watch: asyncio.Task | None = None
        self._lock: asyncio.Lock | None = None
        self._learner_key: Any = None
        self._learner: Any = None
        self._wanted: Any = None  # the learner followed: the newest named by a request or
        self._left: set[Any] = set()  # the driver; and those it followed before
        self._version = -1
        self._blob: bytes | None = None
        self._asked_at = -float("inf")  # when the newest ask of the learner began
        self.requests = self.served = self.current = self.failed = self.in_flight = 0
        self.blobs_in = self.bytes_in = self.bytes_out = self.repeat_blobs = self.asks = 0

    async def weights_if_newer(self, version: int, learner: ActorRef) -> bytes | None:
        """The pickled ``(version, weights)`` of ``learner`` if newer than ``version``, else
        None; at least the version ``learner`` had when this request arrived."""
        arrived = time.monotonic()
        self._watch()
        self.requests += 1
        self.in_flight += 1
        try:
            if failpoint("relay_fails"):  # a failpoint: the relay cannot answer
                raise InjectedFault(f"the weights relay on {self.host} failed (failpoint)")
            held, blob = await self._newest(learner, arrived)
        except BaseException:
            self.in_flight -= 1
            self.failed += 1
            raise
        self.in_flight -= 1
        if failpoint("relay_uncounted"):  # a failpoint: a request answered, never counted
            return None
        if blob is None or held <= int(version):
            self.current += 1
            return None
        self.served += 1
        self.bytes_out += len(blob)
        return blob

    async def _newest(self, learner: ActorRef, arrived: float) -> tuple[int, bytes | None]:
        key = _learner_key(learner)
        self._follow(key)
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if key != self._wanted:  # a newer learner was named meanwhile
                raise self._stale()
            if key != self._learner_key:  # another learner: its versions count afresh
                self._learner_key, self._learner = key, as_handle(learner)
                self._version, self._blob, self._asked_at = -1, None, -float("inf")
            if self._asked_at < arrived - self._max_age:  # no ask recent enough
                began = time.monotonic()
                ask = self._learner.versioned_weights_if_newer(self._version)
                newer = await self._calls.call("learner", ask, self._timeout)
                self.asks += 1
                if newer is not None:
                    got, blob = int(newer[0]), newer[1]
                    self.blobs_in += 1
                    self.bytes_in += len(blob)
                    if got <= self._version:
                        self.repeat_blobs += 1
                    else:
                        self._version, self._blob = got, blob
                self._asked_at = began
            return self._version, self._blob

    def _follow(self, key: Any) -> None:
        """Follow learner ``key`` if it is new (a learner that was followed once and then
        left behind is never followed again: a request naming it fails at once)."""
        if key == self._wanted:
            return
        if key in self._left:
            raise self._stale()
        if self._wanted is not None:
            self._left.add(self._wanted)
        self._wanted = key
        if self._lock is not None and self._lock.locked() and key != self._learner_key:
            self._calls.replaced("learner")  # an ask of the old learner ends now

    def _stale(self) -> StaleLearner:
        return StaleLearner(
            f"the weights relay on {self.host} follows another learner (a rebuilt or "
            "handed-over one) than this request named"
        )

    def _watch(self) -> None:
        if self._orphan_watch is None and self._dask_worker is not None:
            self._orphan_watch = start_supervised(
                "relay.orphan_watch", self._close_when_released, self.failures
            )

    async def _close_when_released(self) -> None:
        """A relay Dask deleted (its driver released it, or died) drops its copy."""
        await until_released(
            self, self._dask_worker, tick=lambda: self.failures.check("relay.orphan_watch")
        )
        await self.close()

    async def set_learner(self, handle: Any, lost: bool = False) -> None:
        """The learner env workers follow from now on: a request naming another fails at
        once. ``lost``: an ask still waiting on a lost learner ends now (its requests fail
        and their env workers pull from the learner they follow)."""
        self._follow(_learner_key(handle))
        if lost:
            self._calls.replaced("learner")

    async def stats(self) -> dict[str, float]:
        """``relay/<host>/*`` counters and this relay's task failures."""
        p = relay_prefix(self.host)
        return {
            f"{p}requests": float(self.requests),
            f"{p}served": float(self.served),
            f"{p}current": float(self.current),
            f"{p}failed": float(self.failed),
            f"{p}in_flight": float(self.in_flight),
            f"{p}asks": float(self.asks),
            f"{p}blobs_in": float(self.blobs_in),
            f"{p}bytes_in": float(self.bytes_in),
            f"{p}bytes_out": float(self.bytes_out),
            f"{p}repeat_blobs": float(self.repeat_blobs),
            f"{p}version": float(self._version),
            **self.failures.metrics(),
        }

    async def close(self) -> None:
        """Drop the copy (a released relay keeps no memory)."""
        self._blob, self._version = None, -1
