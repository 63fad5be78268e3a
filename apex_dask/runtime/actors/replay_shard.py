"""The replay shard actor: one prioritized shard, ``async`` numpy-fast methods only.

A shard usually lives on the learner's worker; its methods run on that
worker's event loop, so none of them may block (each is a few milliseconds
of numpy at most). ``sample()`` answers with the shard's own
:class:`~apex_dask.algo.replay.sample.ReplaySample`, its ``shard_id`` filled in.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from apex_dask.algo.replay.sample import ReplaySample
from apex_dask.experiment.checkpoints.store import (
    CheckpointError,
    CheckpointTimeout,
    read_part,
    write_part,
)
from apex_dask.experiment.flow import ShardFlow
from apex_dask.experiment.results import shard_metrics
from apex_dask.runtime.actors.calls import Throttled, as_handle, call_with_timeout
from apex_dask.runtime.actors.failpoints import failpoint
from apex_dask.runtime.actors.shared_batches import SharedBatch, SharedBatchWriter

__all__ = ["PLAN_SHARE", "ReplayShardActor"]

PLAN_SHARE = 0.7
"""A budgeted save plans its items to take this share of the budget (disks vary)."""

FIRST_BYTES_PER_S = 50e6
"""With no earlier write to go by, a budgeted save plans for a disk this fast (bytes a
second): a cautious guess; each checkpoint written teaches the real rate."""


class ReplayShardActor:
    """One prioritized replay shard (:class:`apex_dask.algo.replay.shard.ReplayShard`).

    ``sample()`` returns None until the shard holds ``learning_starts`` items
    (the run's ``learning_starts / num_shards``); then a
    :class:`~apex_dask.algo.replay.sample.ReplaySample` with ``batch_size``
    items drawn with probability P(i) = p_i^alpha / sum_k p_k^alpha and weights
    w_i = (N P(i))^-beta / max_j w_j (``beta`` constant), this shard's
    ``shard_id`` and ``added``: the items ever added to it (the learner's
    replay-ratio gate reads it; ``added()`` answers the same count).

    ``sample_shared(reader)`` answers the same batch written into a slot of the
    shard's shared-memory block (:mod:`apex_dask.runtime.actors.shared_batches`, ``shared_slots``
    slots): only a small reference crosses the wire to a learner on the same host.
    With every slot held by the reader it waits for one up to ``shared_wait_s``,
    then answers the batch itself.

    Other keyword arguments (``storage``) go to
    :class:`~apex_dask.algo.replay.shard.ReplayShard` unchanged.

    Flow counters (``stats()``): ``rollouts_stored`` (``add`` calls),
    ``batches_sampled`` (non-None ``sample`` replies),
    ``priority_updates_applied`` (``update_priorities`` calls that reached an item) and
    ``priority_updates_stale`` (those that reached none: the items had left, or this
    shard was rebuilt since the sample and never held them; counted, never an error).
    """

    def __init__(
        self,
        shard_id: int,
        capacity: int,
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        learning_starts: int = 0,
        batch_size: int = 32,
        seed: int | None = None,
        run: str = "",
        call_timeout_s: float = 60.0,
        shared_slots: int = 8,
        shared_wait_s: float = 1.0,
        **storage: Any,
    ) -> None:
        from apex_dask.algo.replay.shard import ReplayShard

        self.shard_id = int(shard_id)
        self._shard = ReplayShard(capacity, alpha=alpha, eps=eps, seed=seed, **storage)
        self._beta = float(beta)
        self._learning_starts = max(1, int(learning_starts))
        self._batch_size = int(batch_size)
        self.flow = ShardFlow()
        self._pub = Throttled(f"replay/{self.shard_id}", run)
        self._io = ThreadPoolExecutor(1, thread_name_prefix=f"apex-shard-{shard_id}-io")
        self._writes: list[threading.Event] = []  # checkpoint writes going: set one to abandon it
        self._timeout = float(call_timeout_s)
        # a shard handed over to another (its worker is leaving) forwards every call there;
        # a shard taking over holds calls until the snapshot is in
        self._moved_to: Any = None
        self._taking_over: asyncio.Event | None = None
        self._last_call = time.monotonic()
        self._shared_slots = int(shared_slots)
        self._shared_wait_s = float(shared_wait_s)
        self._writer: SharedBatchWriter | None = None
        self._audit: tuple[int, int] | None = None  # items checked, items that differed
        self._adds_seen = 0  # the drop_rollout_every failpoint's count

    async def _wait_ready(self) -> None:
        """Hold a call while this shard takes over another's items (:meth:`take_over`,
        itself bounded); a ``TimeoutError`` if that outlasts its own bound."""
        self._last_call = time.monotonic()
        if self._taking_over is not None:
            await asyncio.wait_for(self._taking_over.wait(), max(self._timeout, 120.0) + 10.0)

    async def add(self, batch: dict[str, np.ndarray], priorities: np.ndarray | None = None) -> int:
        """Store one rollout (dict of arrays) with its initial priorities; return the items
        stored now (the shard's ``size``, not ``added``)."""
        await self._wait_ready()
        if self._moved_to is not None:
            return await call_with_timeout(self._moved_to.add(batch, priorities), self._timeout)
        if (every := failpoint("drop_rollout_every")) and self._dropped_every(int(every)):
            return len(self._shard)  # a failpoint: acknowledged, not stored
        self._shard.add(batch, priorities)
        self.flow.rollouts_stored += 1
        self._pub.maybe(self._metrics)
        return len(self._shard)

    async def sample(self, batch_size: int | None = None) -> ReplaySample | None:
        """A prioritized batch, or None while fewer than ``learning_starts`` items are held."""
        await self._wait_ready()
        if self._moved_to is not None:
            return await call_with_timeout(self._moved_to.sample(batch_size), self._timeout)
        if len(self._shard) < self._learning_starts:
            return None
        s = self._shard.sample(batch_size or self._batch_size, self._beta)
        if failpoint("wrong_items"):  # a failpoint: each item's data is its neighbour's
            s = replace(s, data={k: np.roll(v, 1, axis=0) for k, v in s.data.items()})
        self.flow.batches_sampled += 1
        return s.with_shard_id(self.shard_id)

    async def sample_shared(
        self, reader: str, batch_size: int | None = None, count: int = 1
    ) -> list[SharedBatch | ReplaySample] | None:
        """As :meth:`sample`, up to ``count`` batches (as many as there are free slots, at
        least one) in shared-memory slots for ``reader`` (the learner's
        :class:`~apex_dask.runtime.actors.shared_batches.SharedBatchReader` id); a batch travels
        itself when no slot frees within ``shared_wait_s`` or shared memory is short."""
        if self._writer is None:
            self._writer = SharedBatchWriter(self._shared_slots, prefix=f"apex{self.shard_id}")
        writer = self._writer
        writer.reader_is(reader)
        deadline = time.monotonic() + self._shared_wait_s
        while writer.free_slots() == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.002)  # the learner frees a slot after each update
        out: list[SharedBatch | ReplaySample] = []
        for _ in range(max(1, min(count, writer.free_slots()))):
            sample = await self.sample(batch_size)
            if sample is None:
                return None
            ref = writer.write(sample)
            out.append(sample if ref is None else ref)
        return out

    async def shared_stats(self) -> dict[str, Any]:
        """Shared-memory hand-off counts: ``written``, ``no_slot``, ``error``, ``block``."""
        w = self._writer
        if w is None:
            return {"written": 0, "no_slot": 0, "error": None, "block": None}
        return {"written": w.written, "no_slot": w.no_slot, "error": w.error, "block": w.block}

    async def update_priorities(
        self,
        indices: np.ndarray,
        priorities: np.ndarray,
        generations: np.ndarray,
        checksums: np.ndarray | None = None,
    ) -> int:
        """Set p_i = priorities (the learner's |TD|; the shard adds eps in the mass) for the
        items sampled with ``indices`` and ``generations`` that are still stored; the
        updates skipped because their item was overwritten since (see
        ``ReplayShard.update_priorities``). With ``checksums`` (``replay.audit_priorities``)
        the items reached are first checked against them (``replay/<k>/audit_*``)."""
        await self._wait_ready()
        if self._moved_to is not None:
            update = self._moved_to.update_priorities(indices, priorities, generations, checksums)
            return await call_with_timeout(update, self._timeout)
        if checksums is not None:
            checked, differ = self._shard.audit(indices, generations, checksums)
            seen = self._audit or (0, 0)
            self._audit = (seen[0] + checked, seen[1] + differ)
        stale = self._shard.update_priorities(indices, priorities, generations)
        if stale and stale == len(indices):  # none of its items is here any more
            self.flow.priority_updates_stale += 1
        else:
            self.flow.priority_updates_applied += 1
        self._pub.maybe(self._metrics)
        return stale

    def _dropped_every(self, every: int) -> bool:
        self._adds_seen += 1
        return self._adds_seen % every == 0

    async def added(self) -> int:
        """Items ever added to this shard."""
        return self._shard.added

    async def stats(self) -> dict[str, float]:
        """Metric-named stats: ``replay/<k>/*`` and this shard's flow counters."""
        return self._metrics()

    async def state_dict(self) -> dict[str, Any]:
        """The shard's contents and priorities (see ``ReplayShard.state_dict``)."""
        return self._shard.state_dict()

    async def save_part(
        self,
        directory: str,
        name: str,
        budget_s: float | None = None,
        s_per_item: float | None = None,
        writers: int = 1,
    ) -> dict[str, Any]:
        """Write this shard into checkpoint ``directory`` as part ``name``; its manifest entry.

        The snapshot is a copy taken at once (a memory copy); the file is
        written by a thread, so the shard keeps taking adds and samples
        meanwhile. Bulk data goes straight to the (shared) filesystem.

        ``budget_s``: the part must be written within that many seconds (a stop's
        grace). Only the newest items that ``s_per_item`` says fit are saved
        (``ReplayShard.state_dict(max_items)``): seconds per item as the last
        checkpoint's write took them, else a guess: :data:`FIRST_BYTES_PER_S` shared
        by the ``writers`` shards writing at once. A
        write still going when the budget is spent is abandoned and a part with no
        items (the counters, rng and priorities' maximum) written instead. The entry
        then also says ``items`` (saved), ``held`` (the shard's items) and
        ``left_out`` (why, when items were left out); every entry says ``write_s``.
        """
        t0 = time.monotonic()
        held = len(self._shard)
        keep = held
        if budget_s is not None:
            if not s_per_item:  # bytes per slot of everything allocated, at a cautious rate
                stats = self._shard.stats()
                rate = FIRST_BYTES_PER_S / max(1, writers)
                s_per_item = stats["bytes"] / stats["capacity"] / rate
            keep = min(held, max(0, int(PLAN_SHARE * budget_s / s_per_item)))
        if budget_s is not None:  # a stop's checkpoint goes first: abandon older writes
            for older in self._writes:
                older.set()
        abandon = threading.Event()
        self._writes.append(abandon)
        state = self._shard.state_dict(max_items=keep)
        loop = asyncio.get_running_loop()
        deadline = None if budget_s is None else t0 + budget_s
        why = "" if keep == held else f"the newest {keep} items fit in {budget_s:.3g} s"
        write = partial(write_part, directory, name, state, deadline=deadline, abandon=abandon)
        try:
            entry = await loop.run_in_executor(self._io, write)
        except CheckpointTimeout:
            if budget_s is None:  # a newer, budgeted checkpoint took over
                raise CheckpointError(f"{directory}: abandoned for a stop's checkpoint") from None
            keep, why = 0, f"its write did not finish in {budget_s:.3g} s"
            state = self._shard.state_dict(max_items=0)
            entry = await loop.run_in_executor(self._io, write_part, directory, name, state)
        finally:
            self._writes.remove(abandon)
        entry.update(items=keep, held=held, write_s=time.monotonic() - t0)
        if why:
            entry["left_out"] = why
        return entry

    async def load_part(self, directory: str, entry: dict[str, Any]) -> int:
        """Restore from a checkpoint part (checksum verified); the items now held."""
        loop = asyncio.get_running_loop()
        state = await loop.run_in_executor(self._io, read_part, directory, entry)
        try:
            self._shard.load_state_dict(state)
        except (KeyError, ValueError, TypeError) as exc:
            raise CheckpointError(
                f"{directory}/{entry['file']}: does not fit replay shard {self.shard_id} "
                f"(another capacity or env?): {exc}"
            ) from None
        return len(self._shard)

    async def hand_over(self, new_ref: Any) -> dict[str, Any]:
        """Give this shard to ``new_ref`` (its worker is leaving): every later call is
        forwarded there. Returns the snapshot (contents, priorities, flow counters) and
        the items held, taken at once with the forwarding switched on: nothing is lost."""
        self._moved_to = as_handle(new_ref)
        flow = {k: int(v) for k, v in vars(self.flow).items()}
        return {"state": self._shard.state_dict(), "flow": flow, "size": len(self._shard)}

    async def take_over(self, old_ref: Any, self_ref: Any) -> tuple[int, int]:
        """Become shard ``old_ref`` (on a worker that is leaving): its snapshot and flow
        counters are pulled straight from it; calls wait meanwhile. ``(items it held at
        the hand-over, items held here now)``."""
        self._taking_over = asyncio.Event()
        try:
            old = as_handle(old_ref)
            got = await call_with_timeout(old.hand_over(self_ref), max(self._timeout, 120.0))
            self._shard.load_state_dict(got["state"])
            self.flow = ShardFlow(**got["flow"])
        finally:
            self._taking_over.set()
            self._taking_over = None
        return int(got["size"]), len(self._shard)

    async def idle_s(self) -> float:
        """Seconds since the last add, sample or priority update reached this shard."""
        return time.monotonic() - self._last_call

    async def close(self) -> None:
        """Flush pending metrics."""
        self._pub.now(self._metrics)
        self._io.shutdown(wait=False)
        if self._writer is not None:
            self._writer.close()

    def _metrics(self) -> dict[str, float]:
        out = shard_metrics(self.shard_id, self._shard.stats(), self.flow)
        if self._audit is not None:
            k = self.shard_id
            out[f"replay/{k}/audit_checked"] = float(self._audit[0])
            out[f"replay/{k}/audit_mismatches"] = float(self._audit[1])
        return out
