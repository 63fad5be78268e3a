"""Sampled batches handed from a shard process to the learner's process through shared memory.

A replay shard in its own process on the learner's host writes each sampled
batch into a slot of a shared-memory block it owns, and sends only a small
:class:`SharedBatch` (block name, slot, layout: a few hundred bytes) instead
of the batch itself (an Atari batch of 512 stacks is ~29 MB, pickled, sent
over loopback TCP and unpickled otherwise). The learner's process maps the
block once and reads the batch in place::

    writer = SharedBatchWriter(slots=6)              # in the shard's process
    ref = writer.write(sample)                       # None while every slot is taken
    ...                                              # ref travels to the learner
    reader = SharedBatchReader()                     # in the learner's process
    sample = reader.open(ref)                        # numpy views into the slot
    ... learner.update(sample.data, sample.weights)  # or staged to the device
    sample.release()                                 # the slot is the writer's again
    shard.update_priorities(sample.indices, td, sample.generations)  # copies: still valid

**Slot states.** The block starts with one state byte per slot: 0 free, 1
held. Only the writer sets 0 -> 1 (before its reply is sent), only the reader
1 -> 0 (after its last read of the slot), so no lock is needed: the reply
message orders the writer's stores before the reader's loads, and a slot is
never rewritten while held. A batch whose arrays no longer fit the slots
(another batch size) gets a new block; the old one is unlinked.

**Lifetime.** The writer creates and unlinks its blocks (``close``); the
reader only maps them from ``/dev/shm`` (Linux; elsewhere ``open`` fails and
the batches travel whole) and closes its maps. A reader that dies holding
slots leaves them held: the writer then has fewer free slots, and falls back
to sending batches whole when it has none.
"""

from __future__ import annotations

import mmap
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

from apex_dask.algo.replay.sample import ReplaySample

__all__ = ["SharedBatch", "SharedBatchReader", "SharedBatchWriter"]

_ALIGN = 64  # bytes: every array starts on a cache line
SHM_DIR = "/dev/shm"  # where POSIX shared memory lives on Linux (the reader maps from here)

Layout = tuple[tuple[str, str, tuple[int, ...], int], ...]  # key, dtype, shape, offset


def _layout(sample: ReplaySample) -> tuple[Layout, int]:
    arrays = {
        "indices": sample.indices,
        "weights": sample.weights,
        "generations": sample.generations,
    }
    arrays.update({f"data/{k}": v for k, v in sample.data.items()})
    out, offset = [], 0
    for key, value in arrays.items():
        arr = np.asarray(value)
        out.append((key, arr.dtype.str, tuple(arr.shape), offset))
        offset += -(-arr.nbytes // _ALIGN) * _ALIGN
    return tuple(out), offset


@dataclass(frozen=True)
class SharedBatch:
    """Where a sampled batch lies: slot ``slot`` of block ``block`` laid out as ``layout``,
    with the sample's ``shard_id`` and ``added``."""

    block: str
    slot: int
    slot_bytes: int
    slots: int
    layout: Layout
    shard_id: int = 0
    added: int = 0

    def with_shard_id(self, shard_id: int) -> SharedBatch:
        """This reference, from shard ``shard_id``."""
        return SharedBatch(
            self.block, self.slot, self.slot_bytes, self.slots, self.layout, shard_id, self.added
        )


def _data_offset(slots: int) -> int:
    return -(-slots // _ALIGN) * _ALIGN


def _views(buf: memoryview, base: int, layout: Layout) -> dict[str, np.ndarray]:
    out = {}
    for key, dtype, shape, offset in layout:
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        out[key] = np.frombuffer(buf, dt, count, base + offset).reshape(shape)
    return out


class SharedBatchWriter:
    """A shard's side: copies sampled batches into free slots of its shared-memory block.

    ``slots`` batches can be held by the reader at once; ``min_free_bytes`` of
    the shared-memory filesystem must stay free, else :meth:`write` returns None
    (the batch then travels whole). ``written`` and ``no_slot`` count writes
    and batches that found no free slot.
    """

    def __init__(self, slots: int = 6, *, prefix: str = "apex", min_free_bytes: int = 1 << 28):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = int(slots)
        self._prefix = prefix
        self._min_free = int(min_free_bytes)
        self._shm: shared_memory.SharedMemory | None = None
        self._layout: Layout = ()
        self._slot_bytes = 0
        self._next = 0
        self._reader: str | None = None
        self.written = 0
        self.no_slot = 0
        self.error: str | None = None

    @property
    def block(self) -> str | None:
        """The name of the current block (None before the first write)."""
        return None if self._shm is None else self._shm.name

    def _ensure(self, layout: Layout, slot_bytes: int) -> bool:
        if self._shm is not None and layout == self._layout:
            return True
        self.close()
        size = _data_offset(self.slots) + self.slots * slot_bytes
        free = _shm_free_bytes()
        if free is not None and free - size < self._min_free:
            self.error = f"{size} bytes of shared memory wanted, {free} free"
            return False
        name = f"{self._prefix}_{os.getpid()}_{secrets.token_hex(4)}"
        self._shm = shared_memory.SharedMemory(name=name, create=True, size=size)
        self._shm.buf[: self.slots] = bytes(self.slots)
        self._layout, self._slot_bytes = layout, slot_bytes
        return True

    def reader_is(self, reader: str) -> None:
        """The reader asking now is ``reader``: a new one (the learner was rebuilt) frees
        every slot, since the reader that held them is gone."""
        if reader != self._reader:
            if self._shm is not None and self._reader is not None:
                self._shm.buf[: self.slots] = bytes(self.slots)
            self._reader = reader

    def free_slots(self) -> int:
        """Slots the reader does not hold."""
        if self._shm is None:
            return self.slots
        return self.slots - sum(self._shm.buf[: self.slots])

    def write(self, sample: ReplaySample) -> SharedBatch | None:
        """Copy ``sample`` into a free slot; its reference, or None (no free slot, or no
        room in shared memory: send the sample itself)."""
        layout, slot_bytes = _layout(sample)
        if not self._ensure(layout, slot_bytes):
            return None
        assert self._shm is not None
        state = self._shm.buf
        for i in range(self.slots):
            k = (self._next + i) % self.slots
            if state[k] == 0:
                break
        else:
            self.no_slot += 1
            return None
        self._next = (k + 1) % self.slots
        base = _data_offset(self.slots) + k * slot_bytes
        views = _views(state, base, layout)
        for key in ("indices", "weights", "generations"):
            np.copyto(views[key], getattr(sample, key), casting="no")
        for key, value in sample.data.items():
            np.copyto(views[f"data/{key}"], value, casting="no")
        del views
        state[k] = 1  # held: the reader frees it
        self.written += 1
        return SharedBatch(
            self._shm.name, k, slot_bytes, self.slots, layout, sample.shard_id, sample.added
        )

    def close(self) -> None:
        """Unlink the block (a reader's existing maps stay valid until it closes them)."""
        if self._shm is not None:
            shm, self._shm = self._shm, None
            shm.close()
            try:
                shm.unlink()
            except FileNotFoundError:
                pass


class SharedBatchReader:
    """The learner's side: maps writers' blocks (once each) and reads batches in place."""

    def __init__(self) -> None:
        self._blocks: dict[str, mmap.mmap] = {}
        self.id = secrets.token_hex(8)  # writers free the slots of an earlier reader
        self.opened = 0
        self.released = 0

    def open(self, ref: SharedBatch) -> ReplaySample:
        """The batch ``ref`` points to, as a :class:`ReplaySample` whose ``data`` are views
        into the slot; call its ``release()`` once nothing reads them any more
        (``FileNotFoundError`` when the block is gone or was never on this host).

        ``indices``, ``weights`` and ``generations`` are copied out of the slot here:
        whoever hands the priorities back after ``release()`` (the sender, a pipelined
        update one step later) reads the sample's own items, never the next batch's.
        """
        block = self._blocks.get(ref.block)
        if block is None:
            # mapped from its file, not through SharedMemory: the writer owns the block and
            # this process must neither track nor unlink it
            fd = os.open(os.path.join(SHM_DIR, ref.block), os.O_RDWR)
            try:
                block = mmap.mmap(fd, 0)
            finally:
                os.close(fd)
            self._blocks[ref.block] = block
        state = memoryview(block)
        views = _views(state, _data_offset(ref.slots) + ref.slot * ref.slot_bytes, ref.layout)
        data = {k[len("data/") :]: v for k, v in views.items() if k.startswith("data/")}
        self.opened += 1
        return ReplaySample(
            views["indices"].copy(),
            views["weights"].copy(),
            data,
            views["generations"].copy(),
            ref.shard_id,
            ref.added,
            lease=self._releaser(state, ref.slot),
        )

    def _releaser(self, state: memoryview, slot: int) -> Callable[[], None]:
        done = [False]

        def release() -> None:
            if not done[0]:
                done[0] = True
                state[slot] = 0
                self.released += 1

        return release

    def forget(self, block: str) -> None:
        """Close this process's map of ``block`` (its writer replaced or unlinked it)."""
        mapped = self._blocks.pop(block, None)
        if mapped is not None:
            try:
                mapped.close()
            except BufferError:  # views still alive: the map goes with the last of them
                pass

    def close(self) -> None:
        """Close every map (views handed out must no longer be read)."""
        for name in list(self._blocks):
            self.forget(name)


def _shm_free_bytes() -> int | None:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize
