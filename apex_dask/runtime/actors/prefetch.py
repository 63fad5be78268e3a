"""The learner's replay prefetcher: sample requests kept in flight, feeding a bounded queue.

Runs as asyncio tasks on the learner's Dask worker loop (never blocking it)::

    links = ShardLinks.on_worker(shard_refs, worker)   # shared with the learner actor
    pf = ReplayPrefetcher(links, inqueue, batch_size=512, prefetch_per_shard=4)
    pf.start(thread_alive)          # one task per slot; prefetch_per_shard slots per shard
    ...                             # the learner thread: inqueue.get(); pf.taken(loop)
    await pf.stop()                 # finish requests in flight, queue what they bring

- Each slot keeps one ``sample()`` request going to its shard. A reply of
  None (the shard holds fewer than its ``learning_starts`` items) makes the
  slot retry after ``idle_poll_s``.
- A batch goes into the inqueue; when the inqueue is full the slot **waits**
  (parked on a future, woken with all other waiters once the learner thread
  has drained the queue to half) and the wait is added to
  ``enqueue_blocked_s`` (summed over slots). Nothing is dropped while the
  learner thread lives.
- A shard living on the learner's worker is called as the local object
  (:class:`ShardLinks`; its async methods run on this loop anyway), and its
  slot waits for queue space *before* sampling, so it never holds a stale batch.
- ``shared_memory``: a shard in another process is asked for ``sample_shared``
  (``shared_per_call`` batches a call: half the calls' cost on this loop);
  each batch comes as a reference to a shared-memory slot, read in place
  (:mod:`apex_dask.runtime.actors.shared_batches`; the learner releases the slot after
  the update). A shard on another host, or whose block cannot be mapped here
  (the batch is then counted lost), is asked for whole batches.
- ``max_replay_ratio`` (rho): a slot waits before requesting while
  (transitions trained before a resume + (batches received + requests in
  flight + 1) * batch_size) > rho * (items
  added to all shards), refreshing the shards' ``added`` counts every 50 ms
  while it waits (``ratio_wait_s``).

Counters: ``batches_received``, ``shared_batches`` (of them, read from shared memory),
``batches_lost`` (requests that failed or timed
out, and batches held when a stop found the learner thread dead),
``enqueue_blocked_s``, ``ratio_wait_s``; ``errors`` keeps the last 10 messages.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from apex_dask.algo.replay.sample import ReplaySample
from apex_dask.runtime.actors.calls import (
    PeerCalls,
    PeerReplaced,
    as_handle,
    local_actor,
    same_host,
)
from apex_dask.runtime.actors.failpoints import failpoint
from apex_dask.runtime.actors.shared_batches import SharedBatch, SharedBatchReader
from apex_dask.runtime.actors.supervision import TaskFailures, start_supervised

__all__ = ["ReplayPrefetcher", "ShardLinks"]


class ShardLinks:
    """The learner's links to its replay shards: per shard id, the handle and what to call.

    Owns, for each shard id ``k``, the actor handle (``handle(k)``) and the
    object to call (``target(k)``): the :class:`ReplayShardActor` itself when
    the shard lives on the learner's worker (``is_local(k)``: called directly,
    no serialization, no loopback round trip), else the handle (called
    through :func:`call_with_timeout`). The learner actor and its prefetcher
    share one; :meth:`set_shard` points shard ``k`` at a rebuilt actor for both.

    ``ShardLinks(targets, handles)`` takes them resolved (``targets[k] is
    handles[k]`` for a remote shard); :meth:`on_worker` resolves refs on a
    Dask worker.
    """

    def __init__(
        self,
        targets: Sequence[Any],
        handles: Sequence[Any],
        resolve: Callable[[Any], Any] | None = None,
        near: Callable[[Any], bool] | None = None,
    ) -> None:
        self._targets = list(targets)
        self._near = near if near is not None else (lambda handle: True)
        self._handles = list(handles)
        if len(self._targets) != len(self._handles):
            raise ValueError(f"{len(self._targets)} targets for {len(self._handles)} handles")
        self._resolve = resolve if resolve is not None else (lambda handle: handle)

    @classmethod
    def on_worker(cls, shards: Sequence[Any], worker: Any) -> ShardLinks:
        """Links to ``shards`` (refs or handles) from an actor on Dask ``worker``."""

        def resolve(handle: Any) -> Any:
            local = local_actor(handle, worker)
            return handle if local is None else local

        handles = [as_handle(s) for s in shards]
        return cls([resolve(h) for h in handles], handles, resolve, lambda h: same_host(h, worker))

    def __len__(self) -> int:
        return len(self._handles)

    def target(self, shard_id: int) -> Any:
        """What to call for shard ``shard_id``: the local actor object or the handle."""
        return self._targets[shard_id]

    def handle(self, shard_id: int) -> Any:
        """The actor handle of shard ``shard_id``."""
        return self._handles[shard_id]

    def same_host(self, shard_id: int) -> bool:
        """Whether shard ``shard_id`` lives on this host (shared memory can reach it)."""
        return self._near(self._handles[shard_id])

    def is_local(self, shard_id: int) -> bool:
        """Whether shard ``shard_id`` is called as a local object."""
        return self._targets[shard_id] is not self._handles[shard_id]

    @property
    def local_count(self) -> int:
        """How many shards are called as local objects."""
        return sum(t is not h for t, h in zip(self._targets, self._handles, strict=True))

    def set_shard(self, shard_id: int, handle: Any) -> None:
        """Shard ``shard_id`` is the actor ``handle`` (a ref or a handle) from now on."""
        handle = as_handle(handle)
        self._handles[shard_id] = handle
        self._targets[shard_id] = self._resolve(handle)


class ReplayPrefetcher:
    """Keeps ``prefetch_per_shard`` sample requests per shard of ``links`` and fills ``inqueue``."""

    def __init__(
        self,
        links: ShardLinks,
        inqueue: queue.Queue,
        *,
        batch_size: int,
        prefetch_per_shard: int = 4,
        max_replay_ratio: float | None = None,
        call_timeout_s: float = 60.0,
        idle_poll_s: float = 0.02,
        shared_memory: bool = False,
        shared_per_call: int = 2,
        failures: TaskFailures | None = None,
    ) -> None:
        self._links = links
        self._failures = failures if failures is not None else TaskFailures("prefetcher")
        self._calls = PeerCalls()  # requests to remote shards, given up when one is rebuilt
        self._reader = SharedBatchReader() if shared_memory else None
        self._by_value: set[int] = set()  # shards whose blocks this process cannot map
        self._shared_per_call = int(shared_per_call)
        self._inq = inqueue
        self._batch_size = int(batch_size)
        self._per_shard = int(prefetch_per_shard)
        self._ratio = max_replay_ratio
        # transitions a restored learner had trained before this prefetcher started:
        # the shards' ``added`` counts continue too, so the ratio holds across a resume
        self.trained_before = 0
        self._timeout = float(call_timeout_s)
        self._idle_poll_s = float(idle_poll_s)
        self._low_water = inqueue.maxsize // 2
        self._slots: list[asyncio.Task] = []
        self._waiters: deque[asyncio.Future] = deque()
        self._wake_pending = False
        self._stopping = False
        self._thread_alive: Callable[[], bool] = lambda: True
        self._in_flight = 0
        self._added = [0] * len(links)
        self._added_checked = [0.0] * len(links)
        self.batches_received = 0
        self.shared_batches = 0
        self.batches_lost = 0
        self.enqueue_blocked_s = 0.0
        self.ratio_wait_s = 0.0
        self.errors: deque[str] = deque(maxlen=10)

    @property
    def added_total(self) -> int:
        """Items added to all shards, as the latest replies said."""
        return sum(self._added)

    @property
    def local_shards(self) -> int:
        """How many shards are called as local objects."""
        return self._links.local_count

    def start(self, thread_alive: Callable[[], bool]) -> None:
        """Start the slots on the running loop; ``thread_alive()`` tells if the consumer lives."""
        self._stopping = False
        self._wake_pending = False
        self._thread_alive = thread_alive
        self._slots = [
            start_supervised("learner.prefetch", partial(self._slot, k), self._failures)
            for _ in range(self._per_shard)
            for k in range(len(self._links))
        ]

    async def stop(self, timeout_s: float) -> None:
        """No new requests; wait for those in flight and queue their batches."""
        self._stopping = True
        if self._slots:
            _, late = await asyncio.wait(self._slots, timeout=timeout_s)
            for t in late:
                t.cancel()
            self._slots = []

    def taken(self, loop: asyncio.AbstractEventLoop) -> None:
        """Call from the consumer thread after each ``get``: wakes waiters at half queue."""
        if self._waiters and not self._wake_pending and self._inq.qsize() <= self._low_water:
            self._wake_pending = True
            loop.call_soon_threadsafe(self._wake_all)

    # ------------------------------------------------------------------ slots
    def shard_replaced(self, shard_id: int, lost: bool = False) -> None:
        """Shard ``shard_id`` is a new actor (already in the links): its ``added`` count
        is read afresh, so items lost with the old shard no longer allow training.
        ``lost``: the old one died with its worker, so the requests still waiting on it
        (they would wait out the call timeout) are given up now, each counted in
        ``batches_lost``, and their slots ask the new shard at once."""
        self._added[shard_id] = 0
        self._added_checked[shard_id] = 0.0
        self._by_value.discard(shard_id)
        if lost:
            self._calls.replaced(("shard", shard_id))

    async def _slot(self, shard_id: int) -> None:
        while not self._stopping:
            self._failures.check("learner.prefetch")
            if failpoint("skip_shard") == shard_id:  # a failpoint: this shard is never asked
                await asyncio.sleep(self._idle_poll_s)
                continue
            links = self._links
            shard, local = links.target(shard_id), links.is_local(shard_id)
            if self._ratio is not None and not await self._ratio_allows(shard_id):
                continue
            self._in_flight += 1  # from the ratio gate until the batch is counted
            try:
                if local:
                    await self._wait_for_space()
                    if self._stopping:
                        break
                    sample = await shard.sample()
                    samples = None if sample is None else [sample]
                else:
                    samples = await self._remote_samples(shard_id, shard)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # dead or slow shard: count and back off
                self.batches_lost += 1
                self.errors.append(f"sample from shard {shard_id}: {type(exc).__name__}: {exc}")
                if not isinstance(exc, PeerReplaced):  # rebuilt: the new one is asked now
                    await asyncio.sleep(min(1.0, self._timeout))
                continue
            finally:
                self._in_flight -= 1
            if samples is None:
                await asyncio.sleep(self._idle_poll_s)
                continue
            self.batches_received += len(samples)  # all held now, queued one by one
            for sample in samples:
                self._added[shard_id] = max(self._added[shard_id], int(sample.added))
                await self._enqueue(sample)
            if local:  # a local sample never suspends: let the other slots take turns
                await asyncio.sleep(0)

    async def _remote_samples(self, shard_id: int, shard: Any) -> list[ReplaySample] | None:
        """Batches from a shard in another process: through shared memory when it can
        (``shared_per_call`` a call, fewer when its slots are short), else one, whole."""
        reader = self._reader
        key = ("shard", shard_id)
        if reader is None or shard_id in self._by_value or not self._links.same_host(shard_id):
            sample = await self._calls.call(key, shard.sample(), self._timeout)
            return None if sample is None else [sample]
        call = shard.sample_shared(reader.id, None, self._shared_per_call)
        replies = await self._calls.call(key, call, self._timeout)
        if replies is None:
            return None
        out = []
        for reply in replies:
            if not isinstance(reply, SharedBatch):
                out.append(reply)
                continue
            try:
                out.append(reader.open(reply))
            except OSError as exc:  # no /dev/shm here: whole batches from now on
                self._by_value.add(shard_id)
                self.batches_lost += 1  # that one stays in the shard's slot
                self.errors.append(
                    f"shard {shard_id} sends whole batches (its shared memory is not on this "
                    f"host: {type(exc).__name__}: {exc})"
                )
                return out or None
            self.shared_batches += 1
        return out

    def close(self) -> None:
        """Unmap the shards' shared-memory blocks (batches read from them must be done)."""
        if self._reader is not None:
            self._reader.close()

    async def _ratio_allows(self, shard_id: int) -> bool:
        """True if one more batch keeps the replay ratio; else waits a little and says False."""
        assert self._ratio is not None
        added = sum(self._added)
        batches = self.batches_received + self._in_flight + 1
        wanted = self.trained_before + batches * self._batch_size
        if added == 0 or wanted <= self._ratio * added:
            return True
        t0 = time.perf_counter()
        now = time.monotonic()
        if now - self._added_checked[shard_id] >= 0.05:  # no sample may be coming: ask
            self._added_checked[shard_id] = now
            try:
                ask = self._links.target(shard_id).added()
                n = await self._calls.call(("shard", shard_id), ask, self._timeout)
                self._added[shard_id] = max(self._added[shard_id], int(n))
            except Exception as exc:
                self.errors.append(f"added() of shard {shard_id}: {type(exc).__name__}: {exc}")
        await asyncio.sleep(0.005)
        self.ratio_wait_s += time.perf_counter() - t0
        return False

    # ---------------------------------------------------------------- the queue
    def _consumer_gone(self) -> bool:
        return self._stopping and not self._thread_alive()

    async def _wait_for_space(self) -> None:
        """Wait while the inqueue is full (counted); a 50 ms timeout is the safety net."""
        if not self._inq.full():
            return
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        while self._inq.full() and not self._consumer_gone():
            fut = loop.create_future()
            self._waiters.append(fut)
            await asyncio.wait([fut], timeout=0.05)
        self.enqueue_blocked_s += time.perf_counter() - t0

    def _wake_all(self) -> None:
        self._wake_pending = False
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    async def _enqueue(self, item: ReplaySample) -> None:
        """Put a batch in the inqueue, waiting for space; never dropped while the thread lives."""
        while True:
            try:
                self._inq.put_nowait(item)
                return
            except queue.Full:
                pass
            if self._consumer_gone():
                self.batches_lost += 1  # the learner thread is gone: counted, not hidden
                return
            await self._wait_for_space()
