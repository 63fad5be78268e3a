"""What crosses an actor boundary: small named types, plain data only.

Three messages close Ape-X's loops (each is pickled by Dask's comm with its
numpy arrays out of band, so there is no copy beyond the wire)::

    env worker --RolloutSummary--> driver        (the rollout itself went to a shard)
    shard      --ReplaySample----> learner       (Replay + Enqueue)
    learner    --PriorityUpdate--> source shard  (Dequeue + update_priorities)

The last two are the algorithm's own types (:mod:`apex_dask.algo.replay.sample`);
the in-process runner uses the same ones, so both runners speak alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from apex_dask.algo.replay.sample import PriorityUpdate, ReplaySample

__all__ = ["PriorityUpdate", "ReplaySample", "RolloutSummary"]


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
