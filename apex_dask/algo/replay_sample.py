"""What a replay shard's ``sample`` returns: the one batch type from the shard to the learner.

Both runners hand it from the shard to the learner as it is
(``experiment.messages.ReplayedBatch`` is this type); the learner returns a
:class:`~apex_dask.experiment.messages.PriorityUpdate` to ``shard_id``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ReplaySample"]


@dataclass(frozen=True, slots=True)
class ReplaySample:
    """A sampled batch: ``data[k][j]`` is the item stored at slot ``indices[j]``.

    ``weights[j]`` is its importance weight; hand ``indices`` back to
    :meth:`ReplayShard.update_priorities` with the new priorities. ``added``
    is the items ever added to the shard when it was drawn (the learner's
    replay-ratio gate reads it); ``shard_id`` the shard it came from, set by
    whoever knows it (:meth:`with_shard_id`; 0 for a lone shard). This one
    type goes from the shard to the learner in both runners
    (``experiment.messages.ReplayedBatch`` is it).

    ``lease`` is set on a sample read in place from shared memory
    (:mod:`apex_dask.algo.shared_batches`): its arrays are views into a slot
    the shard may rewrite once :meth:`release` was called.
    """

    indices: np.ndarray  # int64 [B]
    weights: np.ndarray  # float32 [B]
    data: dict[str, np.ndarray]
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
            self.indices, self.weights, self.data, int(shard_id), self.added, self.lease
        )

    def as_hook_batch(self) -> dict[str, Any]:
        """The ``{"indices", "weights", "data"}`` dict a ``before_learn_on_batch`` hook gets."""
        return {"indices": self.indices, "weights": self.weights, "data": self.data}

    def with_hook_batch(self, batch: Mapping[str, Any]) -> ReplaySample:
        """This sample with what a hook returned (missing keys keep their value)."""
        return ReplaySample(
            batch.get("indices", self.indices),
            batch.get("weights", self.weights),
            batch.get("data", self.data),
            self.shard_id,
            self.added,
            self.lease,
        )
