"""What a replay shard's ``sample`` returns, and what goes back: the two types between a
shard and the learner.

Both runners hand a :class:`ReplaySample` from the shard to the learner as it is;
the learner returns a :class:`PriorityUpdate` to ``shard_id``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["PriorityUpdate", "ReplaySample", "item_checksums"]


def item_checksums(data: Mapping[str, np.ndarray]) -> np.ndarray:
    """A 64-bit checksum (BLAKE2b) of every byte of each item of ``data`` (keys in sorted
    order; first axis: items), uint64 [n]. What the priority audit compares
    (``replay.audit_priorities``): the items a learner trained on against the items the
    shard holds where their priorities land."""
    keys = sorted(data)
    if not keys:
        return np.zeros(0, np.uint64)
    n = len(data[keys[0]])
    rows = np.concatenate(
        [np.ascontiguousarray(data[k]).reshape(n, -1).view(np.uint8) for k in keys], axis=1
    )
    return np.array(
        [
            int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=8).digest(), "little")
            for r in rows
        ],
        dtype=np.uint64,
    )


@dataclass(frozen=True, slots=True)
class PriorityUpdate:
    """New priorities (|TD error|) for the items of a sample, back to its source shard.

    ``indices`` and ``generations`` are the sample's: the shard applies each
    priority only where the slot still holds the item that was sampled
    (:meth:`~apex_dask.algo.replay.shard.ReplayShard.update_priorities`).
    """

    shard_id: int
    indices: np.ndarray  # int64 [B]
    priorities: np.ndarray  # [B]
    generations: np.ndarray  # int64 [B]
    checksums: np.ndarray | None = None
    """uint64 [B]: :func:`item_checksums` of the items trained on, with
    ``replay.audit_priorities`` only."""

    def args(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """The source shard's ``update_priorities`` arguments."""
        return self.indices, self.priorities, self.generations, self.checksums


@dataclass(frozen=True, slots=True)
class ReplaySample:
    """A sampled batch: ``data[k][j]`` is the item stored at slot ``indices[j]``.

    ``weights[j]`` is its importance weight; ``generations[j]`` the write stamp
    of that slot when it was drawn (the item's identity: the slot may be
    rewritten later). Hand ``indices`` and ``generations`` back to
    :meth:`ReplayShard.update_priorities` with the new priorities
    (:meth:`priority_update` makes the message). ``added``
    is the items ever added to the shard when it was drawn (the learner's
    replay-ratio gate reads it); ``shard_id`` the shard it came from, set by
    whoever knows it (:meth:`with_shard_id`; 0 for a lone shard). This one
    type goes from the shard to the learner in both runners.

    ``lease`` is set on a sample read in place from shared memory
    (:mod:`apex_dask.runtime.actors.shared_batches`): its ``data`` arrays are views into a
    slot the shard may rewrite once :meth:`release` was called (``indices``,
    ``weights`` and ``generations`` are the sample's own copies, read before).
    """

    indices: np.ndarray  # int64 [B]
    weights: np.ndarray  # float32 [B]
    data: dict[str, np.ndarray]
    generations: np.ndarray  # int64 [B]
    shard_id: int = 0
    added: int = 0
    lease: Callable[[], None] | None = field(default=None, compare=False, repr=False)

    def release(self) -> None:
        """Done reading the arrays: hand a shared-memory slot back (a no-op otherwise)."""
        if self.lease is not None:
            self.lease()

    def with_shard_id(self, shard_id: int) -> ReplaySample:
        """This sample, from shard ``shard_id``."""
        return ReplaySample(
            self.indices,
            self.weights,
            self.data,
            self.generations,
            int(shard_id),
            self.added,
            self.lease,
        )

    def priority_update(
        self, priorities: np.ndarray, checksums: np.ndarray | None = None
    ) -> PriorityUpdate:
        """The message that gives this sample's items ``priorities`` on its source shard."""
        return PriorityUpdate(self.shard_id, self.indices, priorities, self.generations, checksums)

    def as_hook_batch(self) -> dict[str, Any]:
        """The ``{"indices", "weights", "data"}`` dict a ``before_learn_on_batch`` hook gets."""
        return {"indices": self.indices, "weights": self.weights, "data": self.data}

    def with_hook_batch(self, batch: Mapping[str, Any]) -> ReplaySample:
        """This sample with what a hook returned (missing keys keep their value)."""
        return ReplaySample(
            batch.get("indices", self.indices),
            batch.get("weights", self.weights),
            batch.get("data", self.data),
            self.generations,
            self.shard_id,
            self.added,
            self.lease,
        )
