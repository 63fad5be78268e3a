"""The frames of a frame-stacked replay shard, each kept once, in a ring.

A shard built with ``frame_stack=k`` stores ``obs`` and ``next_obs`` (stacks
``[k, *frame_shape]``) as references into a ring of frames instead of whole
stacks. Each added batch is first put in the compact form of
:mod:`apex_dask.algo.replay.codec` (each frame of the batch once); its frames
are then written, in order, after the frames of the batches before it, and
each item keeps, per stack, the ``k`` ring slots of its frames (uint32).

Memory: the ring has ``ceil(FRAMES_PER_ITEM * capacity)`` frame slots (at
least ``2k``). An n-step fragment of ``L`` env steps needs about
``(L + n + k - 1) / L`` frames per transition (1.12 for ``L = 50``, ``n = 3``,
``k = 4``) plus one per episode start, so with :data:`FRAMES_PER_ITEM` = 1.2
the item ring wraps before the frame ring, and the shard holds ``capacity``
items. Data that needs more frames per item (very short episodes, stacks that
do not overlap) overwrites frames of items still stored; those items, always
the oldest, are **evicted early** (the shard then holds fewer than
``capacity`` items), so no stored item ever refers to an overwritten frame.

Eviction is decided per batch: a log keeps, for each stored batch, its item
count and the id of its first frame (frame ids count every frame ever
written; slot = id % frame capacity). When the frames written reach past a
batch's first frame by more than the ring holds, the whole batch is evicted.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping

import numpy as np

from apex_dask.algo.replay.codec import COMPACT_KEYS, encode_stacks, is_compact, split_compact
from apex_dask.algo.replay.storage import Schema

__all__ = [
    "FRAMES_PER_ITEM",
    "REF_KEYS",
    "FrameStore",
    "Stacked",
    "split_stacked",
    "stacked_schema",
    "user_keys",
]

REF_KEYS = {"obs_refs": "obs", "next_obs_refs": "next_obs"}
"""The item keys holding the ring slots of each stacked key's frames."""

FRAMES_PER_ITEM = 1.2
"""Frame slots per item of capacity."""

Stacked = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A batch's ``(frames, obs_refs, next_obs_refs)``: each frame once, and per item
the rows of ``frames`` of its ``obs`` and ``next_obs`` stacks."""


class FrameStore:
    """A ring of frames for ``capacity`` items of stacks of ``frame_stack`` frames.

    Owns: the frame ring (allocated by the first batch, which fixes the frame
    shape and dtype), the count of frames ever written, the log of stored
    batches that decides early eviction (see the module docstring), and their
    checkpoint state (``frame_stack``, ``frame_capacity``, ``frames/*``). The
    items, with their frames' ring slots, live in the shard's
    :class:`~apex_dask.algo.replay.storage.ItemStorage`.

    Usage (by :class:`~apex_dask.algo.replay.shard.ReplayShard`)::

        store = FrameStore(capacity, 4)
        stacked, items = store.split(batch)       # ValueError for a bad batch
        first, arrays = store.add(*stacked, items, max_items=capacity)
        ...                                       # the item storage stores arrays
        live = store.commit(len(stacked[1]) - first, shard_size)   # items still valid
        data = store.stacks(item_storage.gather(slots))   # obs / next_obs as stacks
    """

    def __init__(self, capacity: int, frame_stack: int) -> None:
        self.frame_stack = int(frame_stack)
        if self.frame_stack < 1:
            raise ValueError(f"frame_stack must be >= 1 or None, got {frame_stack}")
        self.frame_capacity = max(2 * self.frame_stack, math.ceil(FRAMES_PER_ITEM * capacity))
        if self.frame_capacity >= 2**32:
            raise ValueError(f"capacity {capacity} needs more than 2**32 frame slots")
        self.frames: np.ndarray | None = None  # [frame_capacity, *frame_shape]
        self.written = 0  # frames ever written: the id of the next one
        self._log: deque[tuple[int, int]] = deque()  # (items, first frame id), oldest first
        self._logged = 0  # items over the log

    @property
    def nbytes(self) -> int:
        """Bytes of the frame ring (0 before the first batch)."""
        return 0 if self.frames is None else int(self.frames.nbytes)

    def allocate(self, frame_shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Make the ring for frames of this shape and dtype."""
        self.frames = np.empty((self.frame_capacity, *frame_shape), dtype)

    # --------------------------------------------------------------- writing
    def split(self, batch: Mapping[str, np.ndarray]) -> tuple[Stacked, dict[str, np.ndarray]]:
        """:func:`split_stacked`, and ``ValueError`` when its frames are not the ring's.

        Changes nothing.
        """
        frames, orefs, nrefs, items = split_stacked(batch, self.frame_stack)
        mine = self.frames
        if mine is not None and (frames.dtype, frames.shape[1:]) != (mine.dtype, mine.shape[1:]):
            k = self.frame_stack
            raise ValueError(
                f"frames make stacks {frames.dtype}{[k, *frames.shape[1:]]}, "
                f"the schema says {mine.dtype}{[k, *mine.shape[1:]]}"
            )
        return (frames, orefs, nrefs), items

    def add(
        self,
        frames: np.ndarray,
        orefs: np.ndarray,
        nrefs: np.ndarray,
        items: Mapping[str, np.ndarray],
        *,
        max_items: int,
    ) -> tuple[int, dict[str, np.ndarray]]:
        """Write the frames of the newest items of a batch that fit; ``(first, items)``.

        The items kept are ``first..n-1`` of the batch (:meth:`fit`); the
        returned item arrays are theirs, with ``obs_refs`` / ``next_obs_refs``
        set to the ring slots of their frames. The first batch allocates the
        ring (also an empty one, which writes nothing). Follow a non-empty
        batch with :meth:`commit` once its items are stored.
        """
        if self.frames is None:
            self.allocate(frames.shape[1:], frames.dtype)
        if orefs.shape[0] == 0:
            return 0, dict(items)
        frames, orefs, nrefs, first = self.fit(frames, orefs, nrefs, max_items)
        out = {key: v[first:] for key, v in items.items()} if first else dict(items)
        out["obs_refs"], out["next_obs_refs"] = self.write(frames, orefs, nrefs)
        return first, out

    def fit(
        self, frames: np.ndarray, orefs: np.ndarray, nrefs: np.ndarray, max_items: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Drop frames no item uses, and leading items until the rest fits.

        At most ``max_items`` items are kept, and the frames they use must fit
        in the ring. Returns ``(frames, orefs, nrefs, first)``: the items kept
        are ``first..n-1`` of the input, with refs into the returned frames.
        """
        n, m = orefs.shape[0], frames.shape[0]
        last_use = np.full(m, -1, np.int64)  # the last item using each frame
        items = np.repeat(np.arange(n), orefs.shape[1])
        np.maximum.at(last_use, orefs.ravel(), items)
        np.maximum.at(last_use, nrefs.ravel(), items)
        first = max(0, n - max_items)
        used = last_use >= first
        if used.sum() > self.frame_capacity:  # keep items while their frames fit
            first = max(first, int(np.sort(last_use)[::-1][self.frame_capacity]) + 1)
            used = last_use >= first
        if first == 0 and used.all():
            return frames, orefs, nrefs, 0
        new_index = np.cumsum(used) - 1
        return frames[used], new_index[orefs[first:]], new_index[nrefs[first:]], first

    def write(
        self, frames: np.ndarray, orefs: np.ndarray, nrefs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Append ``frames`` to the ring; the ring slots (uint32) of the refs.

        The caller ensures ``len(frames) <= frame_capacity`` (:meth:`fit`).
        """
        cap, m = self.frame_capacity, frames.shape[0]
        start = self.written % cap
        n1 = min(m, cap - start)
        self.frames[start : start + n1] = frames[:n1]
        self.frames[: m - n1] = frames[n1:]
        self._log.append((0, self.written))  # items are counted by commit()
        self.written += m
        slots = np.arange(start, start + m, dtype=np.int64)
        slots[slots >= cap] -= cap
        slots = slots.astype(np.uint32)
        return slots[orefs], slots[nrefs]

    def commit(self, items: int, size: int) -> int:
        """Record that the last :meth:`write`'s batch stored ``items`` items.

        ``size``: the items the shard holds now, this batch included (the
        newest ``size`` slots). Returns how many of them remain valid: batches
        whose frames were overwritten are evicted from the log, and so are
        batches whose items the ring overwrote.
        """
        first_frame = self._log.pop()[1]
        self._log.append((items, first_frame))
        self._logged += items
        oldest_valid = self.written - self.frame_capacity
        while self._log and self._log[0][1] < oldest_valid:
            self._logged -= self._log.popleft()[0]
        live = min(size, self._logged)
        while self._log and self._logged - self._log[0][0] >= live:
            self._logged -= self._log.popleft()[0]
        return live

    # --------------------------------------------------------------- reading
    def gather(self, slots: np.ndarray) -> np.ndarray:
        """Stacks ``[B, k, *frame_shape]`` from ring slots ``[B, k]``."""
        out = self.frames.take(slots.reshape(-1), axis=0)
        return out.reshape(*slots.shape, *self.frames.shape[1:])

    def stacks(self, items: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Gathered items with ``obs`` / ``next_obs`` stacks in place of their refs."""
        return {
            REF_KEYS[k] if k in REF_KEYS else k: self.gather(v) if k in REF_KEYS else v
            for k, v in items.items()
        }

    def user_schema(self, item_schema: Schema) -> Schema:
        """The schema users see for items of ``item_schema`` (:func:`stacked_schema`)."""
        if self.frames is None:
            return dict(item_schema)
        f = self.frames
        return stacked_schema(item_schema, (f.dtype, (self.frame_stack, *f.shape[1:])))

    # ------------------------------------------------------------ checkpoint
    def state_dict(self, newest_items: int | None = None) -> dict[str, np.ndarray | int]:
        """``frame_stack``, ``frame_capacity`` and ``frames/*``: the frames the log's batches
        use (oldest first, each once), the log and the count of frames written.

        ``newest_items``: only what the newest that many items need (the shard keeps
        only them): the log's newest batches holding them, the oldest of those
        counted with the items of it kept, and their frames. The frames keep their
        ids (``written`` is unchanged), so the items' ring slots stay valid.
        """
        log = list(self._log)
        if newest_items is not None:
            kept: list[tuple[int, int]] = []
            need = max(0, int(newest_items))
            for items, first_frame in reversed(log):
                if need <= 0:
                    break
                kept.append((min(items, need), first_frame))
                need -= items
            log = kept[::-1]
        first = log[0][1] if log else self.written
        ids = np.arange(first, self.written) % self.frame_capacity
        frames = self.frames[ids] if self.frames is not None else np.zeros((0,), np.uint8)
        return {
            "frame_stack": self.frame_stack,
            "frame_capacity": self.frame_capacity,
            "frames/written": self.written,
            "frames/data": frames,
            "frames/log_items": np.array([i for i, _ in log], np.int64),
            "frames/log_first": np.array([f for _, f in log], np.int64),
        }

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore :meth:`state_dict` (``ValueError`` when it does not fit this ring; nothing
        changed then). The shard checks ``frame_stack``."""
        cap = int(np.asarray(state["frame_capacity"]).item())
        if cap != self.frame_capacity:
            raise ValueError(
                f"state has frame_capacity={cap}, this shard has {self.frame_capacity}"
            )
        written = int(np.asarray(state["frames/written"]).item())
        frames = np.asarray(state["frames/data"])
        items = np.asarray(state["frames/log_items"], np.int64)
        first = np.asarray(state["frames/log_first"], np.int64)
        count = frames.shape[0] if frames.ndim > 1 else 0
        if items.shape != first.shape or count > cap or (len(first) and first[0] < written - count):
            raise ValueError("state frames/* arrays are inconsistent")
        self.written = written
        self._log = deque(zip(items.tolist(), first.tolist(), strict=True))
        self._logged = int(items.sum())
        self.frames = None
        if frames.ndim > 1:
            self.allocate(frames.shape[1:], frames.dtype)
            self.frames[np.arange(written - count, written) % cap] = frames


def split_stacked(
    batch: Mapping[str, np.ndarray], frame_stack: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """``(frames, obs_refs, next_obs_refs, items)`` of a batch of full stacks or a compact one.

    ``items`` is the batch as the item storage keeps it: the stacked keys
    become ``obs_refs, next_obs_refs`` (uint32, here still rows of ``frames``),
    the other keys stay. ``ValueError`` for stacks that are not ``[k, ...]``
    or a batch that mixes both forms.
    """
    k = frame_stack
    if is_compact(batch) == ("obs" in batch or "next_obs" in batch):
        raise ValueError(f"batch must have obs/next_obs or {list(COMPACT_KEYS)}: {sorted(batch)}")
    if is_compact(batch):
        frames, orefs, nrefs = split_compact(batch, k)
    else:
        stacks = [np.asarray(batch[key]) for key in ("obs", "next_obs") if key in batch]
        if len(stacks) < 2 or stacks[0].ndim < 2 or stacks[0].shape[1] != k:
            got = [f"{a.dtype}{list(a.shape[1:])}" for a in stacks]
            raise ValueError(f"frame_stack={k} needs obs and next_obs items [{k}, ...]: {got}")
        frames, orefs, nrefs = encode_stacks(*stacks)
    items = {}
    for key, value in batch.items():
        if key in ("obs", "obs_refs"):
            items["obs_refs"] = orefs.astype(np.uint32)
        elif key in ("next_obs", "next_obs_refs"):
            items["next_obs_refs"] = nrefs.astype(np.uint32)
        elif key != "frames":
            items[key] = value
    return frames, orefs, nrefs, items


def stacked_schema(item_schema: Schema, stacked: tuple[np.dtype, tuple[int, ...]]) -> Schema:
    """The schema users see: ``obs``/``next_obs`` as ``stacked`` in place of their refs."""
    return {REF_KEYS.get(k, k): stacked if k in REF_KEYS else v for k, v in item_schema.items()}


def user_keys(item_keys: Iterable[str]) -> list[str]:
    """The keys users give for these item keys: ``obs`` / ``next_obs`` for their refs."""
    return [REF_KEYS.get(key, key) for key in item_keys]
