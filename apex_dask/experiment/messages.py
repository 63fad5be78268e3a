"""What crosses an actor boundary: small named types, plain data only.

Three messages close Ape-X's loops (each is pickled by Dask's comm with its
numpy arrays out of band, so there is no copy beyond the wire)::

    env worker --RolloutSummary--> driver        (the rollout itself went to a shard)
    shard      --ReplayedBatch---> learner       (Replay + Enqueue)
    learner    --PriorityUpdate--> source shard  (Dequeue + update_priorities)

The in-process runner uses the same types, so both runners speak alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PriorityUpdate", "ReplayedBatch", "RolloutSummary"]


@dataclass(frozen=True, slots=True)
class RolloutSummary:
    """What an env worker tells the driver about the rollouts one call stored in shards.

    Only what the driver uses, since one crosses the network per call (the
    driver's share of a site's bytes, ``docs/cluster.md``): ``steps`` env
    steps in ``rollouts`` rollouts; ``weights_version`` the learner version
    the last one acted with; ``episode_returns`` / ``episode_lengths`` the
    episodes that ended in them; ``env_errors`` the env errors the worker
    survived since its last summary; ``warnings`` the Python warnings raised in
    its process since then (one line each; the driver logs them to
    ``py.warnings``). Per-worker counters travel in ``stats()``.
    """

    steps: int
    rollouts: int
    weights_version: int
    episode_returns: tuple[float, ...] = ()
    episode_lengths: tuple[int, ...] = ()
    env_errors: int = 0
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReplayedBatch:
    """A prioritized batch from shard ``shard_id``.

    ``data[k][j]`` is the item at slot ``indices[j]``, ``weights[j]`` its
    importance weight; ``added`` the items ever added to the shard (the
    learner's replay-ratio gate reads it).
    """

    shard_id: int
    indices: np.ndarray
    weights: np.ndarray
    data: dict[str, np.ndarray]
    added: int = 0

    def as_hook_batch(self) -> dict[str, Any]:
        """The ``{"indices", "weights", "data"}`` dict a ``before_learn_on_batch`` hook gets."""
        return {"indices": self.indices, "weights": self.weights, "data": self.data}

    def with_hook_batch(self, batch: dict[str, Any]) -> ReplayedBatch:
        """This batch with what a hook returned (missing keys keep their value)."""
        return ReplayedBatch(
            self.shard_id,
            batch.get("indices", self.indices),
            batch.get("weights", self.weights),
            batch.get("data", self.data),
            self.added,
        )


@dataclass(frozen=True, slots=True)
class PriorityUpdate:
    """New priorities (|TD error|) for the items of a batch, back to its source shard."""

    shard_id: int
    indices: np.ndarray
    priorities: np.ndarray
