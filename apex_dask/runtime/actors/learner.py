"""The learner actor: a training thread fed by a replay prefetcher on the worker's loop.

::

    shards --sample (prefetch_per_shard in flight each)--> prefetcher (asyncio tasks)
        --> inqueue (bounded, learner.inqueue_size) --> learner thread: update()
        --> outqueue --> priority sender --> update_priorities on the source shard

- The **prefetcher** (:class:`~apex_dask.runtime.actors.prefetch.ReplayPrefetcher`, asyncio
  tasks on the worker loop) keeps ``prefetch_per_shard`` requests per shard, fills the inqueue;
  a full inqueue makes it wait (``learner/enqueue_blocked_s``), never drop.
  Shards on the learner's own worker (the default placement) are called as
  local objects: no serialization, no loopback round trip. The learner and
  the prefetcher share one :class:`~apex_dask.runtime.actors.prefetch.ShardLinks`.
- The **learner thread** takes :class:`~apex_dask.algo.replay.sample.ReplaySample` s
  (``learner/dequeue_s`` times that wait: high means starved), runs the user's
  ``before_learn_on_batch(batch, shard_id)`` hook, then the agent's learner's ``submit``
  (:mod:`apex_dask.algo.agents.base`: a pipelined learner's results come one update later)
  (``learner/grad_s``, CPU ``learner/grad_cpu_s``; denormals flushed, heap kept:
  :mod:`.heap`), hands a ``PriorityUpdate`` (the sample's own indices and generations)
  to the outqueue, then releases a shared-memory batch.
  ``learner/overall_s`` times the whole step; ``learner/queue_size`` a window of sizes.
- The **priority sender** (:mod:`.priority_sender`, a supervised asyncio task) drains the outqueue every 4 ms to each
  update's source shard (inline if local, a task with a timeout if remote); the learner
  thread never wakes the loop per update (each wake-up hands the GIL to the loop thread).
- With ``max_replay_ratio``, the prefetcher waits while
  (batches requested + 1) * batch_size > ratio * (items added to all shards).
- ``weights_if_newer(v)``: one pickled ``(version, weights)`` blob per version, made under
  the model lock (held by the learner thread during each update).

Flow counters: ``flow/batches_received``, ``flow/batches_in_queue``,
``flow/batches_trained``, ``flow/priority_updates_sent``, ``flow/batches_lost`` (failed or
timed-out sample requests, and batches held by the prefetcher when a stop found the learner
thread dead). Quiescent: ``batches_received == batches_trained + batches_in_queue``.
"""

from __future__ import annotations

import asyncio
import pickle
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from apex_dask.algo.agents.base import LearnerProtocol
from apex_dask.algo.agents.device_batches import FinishedUpdate
from apex_dask.algo.agents.spec import AgentSpec
from apex_dask.algo.replay.sample import ReplaySample, item_checksums
from apex_dask.experiment.builder import Hook
from apex_dask.experiment.checkpoints.store import CheckpointError, read_part, write_part
from apex_dask.experiment.flow import LearnerFlow
from apex_dask.experiment.results import learner_metrics
from apex_dask.experiment.timers import Timer, WindowStat
from apex_dask.runtime.actors.calls import (
    Throttled,
    as_handle,
    call_with_timeout,
    current_worker,
    until_released,
)
from apex_dask.runtime.actors.failpoints import failpoint
from apex_dask.runtime.actors.heap import keep_freed_heap
from apex_dask.runtime.actors.prefetch import ReplayPrefetcher, ShardLinks
from apex_dask.runtime.actors.priority_sender import PrioritySender
from apex_dask.runtime.actors.supervision import TaskFailures, start_supervised

__all__ = ["LearnerActor"]


class LearnerActor:
    """Owns the agent's learner (``agent``: an :class:`~apex_dask.algo.agents.spec.AgentSpec`),
    its thread and its prefetcher.

    Call ``start()`` once the shards exist, ``stop()`` to drain and halt (after
    which ``batches_received == batches_trained + batches_in_queue`` and every
    priority update sent has been answered or failed).
    """

    def __init__(
        self,
        observation_space: Any,
        action_space: Any,
        shards: Sequence[Any],
        *,
        agent: AgentSpec,
        seed: int = 0,
        batch_size: int,
        inqueue_size: int = 16,
        prefetch_per_shard: int = 4,
        max_replay_ratio: float | None = None,
        call_timeout_s: float = 60.0,
        before_learn_on_batch: Hook | None = None,
        idle_poll_s: float = 0.02,
        run: str = "",
        shared_memory: bool = False,
        audit_priorities: bool = False,
    ) -> None:
        from apex_dask.algo.agents.registry import make_learner

        worker = current_worker()  # None: the actor runs in this process, without Dask
        self._worker = worker
        self._orphan_watch: asyncio.Task | None = None
        self._loop = None if worker is None else worker.loop.asyncio_loop
        self._learner: LearnerProtocol = make_learner(
            agent, observation_space, action_space, seed=seed
        )
        # A shard on this worker is called as a local object (see the module docstring).
        local = worker is None
        self._links = ShardLinks(shards, shards) if local else ShardLinks.on_worker(shards, worker)
        self._inq: queue.Queue = queue.Queue(maxsize=int(inqueue_size))
        self.failures = TaskFailures("learner")
        self._prefetcher = ReplayPrefetcher(
            self._links,
            self._inq,
            batch_size=batch_size,
            prefetch_per_shard=prefetch_per_shard,
            max_replay_ratio=max_replay_ratio,
            call_timeout_s=call_timeout_s,
            idle_poll_s=idle_poll_s,
            shared_memory=shared_memory,
            failures=self.failures,
        )
        self._sender = PrioritySender(self._links, self.failures, call_timeout_s)
        self._timeout = float(call_timeout_s)
        self._hook = before_learn_on_batch
        # replay.audit_priorities: updates carry checksums of the items trained on
        self._audit: dict[int, np.ndarray] | None = {} if audit_priorities else None
        self._model_lock, self._stats_lock = threading.Lock(), threading.Lock()
        self._snap_pool = ThreadPoolExecutor(1, thread_name_prefix="apex-weights")
        self._snap_lock: asyncio.Lock | None = None
        self._blob: tuple[int, bytes] | None = None
        self.weight_snapshots = 0
        self.weight_sends = self.weight_bytes_sent = 0  # blobs handed out (relays, env workers)
        # learner-thread state
        self._thread: threading.Thread | None = None
        self._thread_error: str | None = None
        self._stop_thread = False
        self._dequeue, self._grad, self._grad_cpu, self._overall = (Timer(100) for _ in range(4))
        self._qsize = WindowStat("learner/queue_size", 50)
        self._window: deque[tuple[float, float, float]] = deque(maxlen=50)
        self.batches_trained = self.hook_calls = 0
        # the learner's counters as of the last batch counted in ``batches_trained``: a
        # stats call between an update and its count reads both sides of the same step
        self._counts = self._learner.counters()
        self._pub = Throttled("learner", run)

    # ------------------------------------------------------------------ control
    async def start(self) -> None:
        """Start the learner thread, the prefetcher and the priority sender (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop_thread = False
        self._loop = self._loop or asyncio.get_running_loop()
        self._snap_lock = asyncio.Lock()
        keep_freed_heap()
        self._thread = threading.Thread(target=self._train_loop, name="apex-learner", daemon=True)
        self._thread.start()
        self._sender.start()
        if self._worker is not None and self._orphan_watch is None:
            self._orphan_watch = start_supervised(
                "learner.orphan_watch", self._stop_when_released, self.failures
            )
        self._prefetcher.start(thread_alive=self._thread.is_alive)

    async def stop(self, timeout_s: float = 30.0) -> dict[str, float]:
        """Stop requesting, queue the batches held, train what is queued, flush priorities,
        all within ``timeout_s`` (what is not done by then is left); the final :meth:`stats`."""
        end = time.monotonic() + timeout_s
        left = lambda: max(0.0, end - time.monotonic())  # noqa: E731
        await self._prefetcher.stop(left())
        thread = self._thread
        if thread is not None:
            self._stop_thread = True  # the thread trains what is queued, then exits
            await asyncio.get_running_loop().run_in_executor(None, thread.join, left())
        await self._sender.stop(left())
        self._pub.now(self._metrics)  # the counters the final stats hold
        return self._metrics()

    async def _stop_when_released(self) -> None:
        """A learner Dask deleted (its driver released it, or died) stops its thread,
        prefetcher and sender: nothing trains on, orphaned, on the worker."""
        await until_released(
            self, self._worker, tick=lambda: self.failures.check("learner.orphan_watch")
        )
        await self.close(5.0)  # its peers may be gone with it: no waiting on them

    async def set_shard(self, shard_id: int, handle: Any, lost: bool = False) -> None:
        """Use replay shard ``shard_id``'s new actor (a ref or handle) from now on.

        ``lost``: the old one died with its worker (a rebuilt shard): the sample
        requests and priority updates still waiting on it would wait out the call
        timeout, so they are given up now (counted in ``flow/batches_lost`` and
        ``flow/priority_updates_failed``) and the new shard is sampled at once. Without
        it (a shard handed over while its worker retires) they finish there.
        """
        self._links.set_shard(shard_id, handle)
        self._prefetcher.shard_replaced(shard_id, lost)
        self._sender.shard_replaced(shard_id, lost)

    async def close(self, timeout_s: float = 30.0) -> None:
        """Stop everything (within ``timeout_s``) and publish the last metrics."""
        await self.stop(timeout_s)
        self._prefetcher.close()
        self._snap_pool.shutdown(wait=False)
        self._pub.now(self._metrics)

    # ------------------------------------------------------------ learner thread
    def _take(self) -> ReplaySample | None:
        """The next batch; None once a stop was asked and the queue is empty."""
        while True:
            try:
                return self._inq.get(timeout=0.05)
            except queue.Empty:
                if self._stop_thread:
                    return None
                self._pub.maybe(self._metrics)  # starved or not started: still published

    def _train_loop(self) -> None:
        loop = self._loop
        torch.set_flush_denormal(True)  # per thread; denormals in Adam's state are slow on x86
        try:
            while True:
                self.failures.check("learner.thread")
                if failpoint("stall_learner"):  # a failpoint: alive, training nothing
                    time.sleep(0.05)
                    continue
                t0 = time.perf_counter()
                item = self._take()
                t1 = time.perf_counter()
                self._prefetcher.taken(loop)  # wakes waiting producers at half queue
                if item is None:
                    break
                qsize = self._inq.qsize()
                batch = item
                if self._hook is not None:
                    batch = batch.with_hook_batch(self._hook(batch.as_hook_batch(), batch.shard_id))
                    self.hook_calls += 1
                if self._audit is not None:  # the items as sampled, before any hook
                    self._audit[id(batch)] = item_checksums(item.data)
                t2, c2 = time.perf_counter(), time.thread_time()
                done = self._train(batch)
                t3, c3 = time.perf_counter(), time.thread_time()
                self._hand_back(done)  # before the release: the updates carry the sample's own
                item.release()  # a shared-memory slot: read (or staged) by now
                with self._stats_lock:
                    self._dequeue.push(t1 - t0)
                    self._grad.push(t3 - t2)
                    self._grad_cpu.push(c3 - c2)
                    self._qsize.push(qsize)
                    self._overall.push(time.perf_counter() - t0)
                self._pub.maybe(self._metrics)
            with self._model_lock:  # a pipelined learner's last update
                self._hand_back(self._learner.drain())
        except BaseException as exc:  # surfaced through stats() to the driver
            self._thread_error = f"{type(exc).__name__}: {exc}"
            self.failures.failed("learner.thread", exc)

    def _train(self, batch: ReplaySample) -> list[FinishedUpdate]:
        """The updates whose results are in: this batch's (a pipelined learner's: the one
        before it)."""
        with self._model_lock:
            done = self._learner.submit(batch.data, batch.weights, tag=batch)
            with self._stats_lock:  # the batch and the learner's counters move together
                self.batches_trained += 1
                self._counts = self._learner.counters()
            return done

    def _hand_back(self, done: list[FinishedUpdate]) -> None:
        for d in done:  # the outqueue, and the loss window
            sums = None if self._audit is None else self._audit.pop(id(d.tag))
            self._sender.put(d.tag.priority_update(d.td_abs, sums))
            self._window.append((d.loss, d.mean_q, d.grad_norm))

    # ----------------------------------------------------------------- weights
    def _snapshot(self) -> tuple[int, bytes]:
        with self._model_lock:
            version, weights = self._learner.get_weights()
        return version, pickle.dumps((version, weights), protocol=pickle.HIGHEST_PROTOCOL)

    async def weights_if_newer(self, version: int) -> bytes | None:
        """A pickled ``(version, {name: array})`` if the learner is past ``version``, else None
        (serialized at most once per version, however many env workers ask)."""
        newer = await self.versioned_weights_if_newer(version)
        return None if newer is None else newer[1]

    async def versioned_weights_if_newer(self, version: int) -> tuple[int, bytes] | None:
        """``(version, blob)`` of :meth:`weights_if_newer`, else None (a weights relay keeps
        the version without unpickling the blob)."""
        if self._learner.version <= version:
            return None
        if self._snap_lock is None:
            self._snap_lock = asyncio.Lock()
        async with self._snap_lock:
            if self._blob is None or self._blob[0] < self._learner.version:
                loop = asyncio.get_running_loop()
                self._blob = await loop.run_in_executor(self._snap_pool, self._snapshot)
                self.weight_snapshots += 1
        blob_version, blob = self._blob
        if blob_version <= version:
            return None
        self.weight_sends += 1
        self.weight_bytes_sent += len(blob)
        return blob_version, blob

    async def get_weights(self) -> tuple[int, dict[str, np.ndarray]]:
        """``(version, {name: CPU array})`` of the online net, read between updates."""
        loop = asyncio.get_running_loop()
        return pickle.loads((await loop.run_in_executor(self._snap_pool, self._snapshot))[1])

    def _state(self) -> dict[str, Any]:
        with self._model_lock:
            return self._learner.state_dict()

    async def state_dict(self) -> dict[str, Any]:
        """The learner's checkpoint state (nets, optimizer, counters), read between updates."""
        return await asyncio.get_running_loop().run_in_executor(self._snap_pool, self._state)

    async def save_part(self, directory: str, name: str) -> dict[str, Any]:
        """Write the learner's state into checkpoint ``directory`` as part ``name`` (training
        pauses only while the state is copied under the model lock, not while it is written)."""

        def save() -> dict[str, Any]:
            return write_part(directory, name, self._state())

        return await asyncio.get_running_loop().run_in_executor(self._snap_pool, save)

    async def load_part(self, directory: str, entry: dict[str, Any]) -> int:
        """Restore from a checkpoint part (checksum verified); the weights version."""

        def load() -> int:
            return self._load(read_part(directory, entry), f"{directory}/{entry['file']}")

        return await asyncio.get_running_loop().run_in_executor(self._snap_pool, load)

    async def take_over(self, old_ref: Any) -> int:
        """Continue from the (stopped) learner ``old_ref``, whose worker is leaving: its
        state is pulled straight from it, a fresh snapshot. The weights version."""
        old = as_handle(old_ref)
        state = await call_with_timeout(old.state_dict(), max(self._timeout, 120.0))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._snap_pool, self._load, state, "the old learner")

    def _load(self, state: dict[str, Any], source: str) -> int:
        try:
            with self._model_lock:
                self._learner.load_state_dict(state)
                with self._stats_lock:
                    self._counts = self._learner.counters()
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            raise CheckpointError(
                f"{source}: does not fit this learner (another network or env?): "
                f"{type(exc).__name__}: {first}"
            ) from None
        self._blob = None
        self._prefetcher.trained_before = int(self._learner.steps_trained)
        return int(self._learner.version)

    # ------------------------------------------------------------------- stats
    async def thread_error(self) -> str | None:
        """Why the learner thread died (None while it lives): a cheap health check."""
        return self._thread_error

    async def progress(self) -> tuple[int, int]:
        """Transitions trained and items added to all shards (as the prefetcher last saw
        them): a cheap call for the driver's replay-ratio gate."""
        return int(self._learner.steps_trained), self._prefetcher.added_total

    async def stats(self) -> dict[str, Any]:
        """Metric-named learner stats (``learner/*`` and ``flow/*``); ``errors`` as strings."""
        out: dict[str, Any] = self._metrics()
        out["errors"] = list(self._prefetcher.errors) + list(self._sender.errors)
        out["thread_error"] = self._thread_error
        out["device"] = self._learner.device
        out["priority_ledger"] = self._sender.ledger()  # the driver's priority-update law
        return out

    def _metrics(self) -> dict[str, float]:
        pf = self._prefetcher
        with self._stats_lock:
            return learner_metrics(
                self._learner,
                dequeue=self._dequeue,
                grad=self._grad,
                grad_cpu=self._grad_cpu,
                overall=self._overall,
                queue_size=self._qsize,
                recent=list(self._window),
                counts=self._counts,
                counters={
                    "learner/enqueue_blocked_s": pf.enqueue_blocked_s,
                    "learner/ratio_wait_s": pf.ratio_wait_s,
                    "learner/hook_calls": self.hook_calls,
                    "learner/local_shards": pf.local_shards,
                    "learner/shared_batches": pf.shared_batches,
                    "learner/weight_snapshots": self.weight_snapshots,
                    "learner/weight_sends": self.weight_sends,
                    "learner/weight_bytes_sent": self.weight_bytes_sent,
                    "learner/outbox_size": len(self._sender.outbox),
                    "learner/priority_sends_in_flight": self._sender.in_flight,
                    **self.failures.metrics(),
                },
                flow=LearnerFlow(
                    batches_received=pf.batches_received,
                    batches_in_queue=self._inq.qsize(),
                    batches_trained=self.batches_trained,
                    priority_updates_sent=self._sender.sent,
                    priority_updates_failed=self._sender.failed,
                    batches_lost=pf.batches_lost,
                ),
            )
