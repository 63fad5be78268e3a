"""What each actor offers, as the driver and the other actors call it.

A handle's method returns an :class:`ActorCall` at once: ``await`` it on an
event loop, or ``.result(timeout)`` from a thread (Dask's ``ActorFuture``).
The classes in this package implement these (``tests/runtime/test_contracts.py``
holds them to it); the orchestration types its handles with them::

    shard:   add -> sample -> update_priorities         (+ added, stats, parts)
    learner: start -> weights_if_newer ... -> stop      (+ progress, stats, parts)
    env:     sync_weights -> sample_into ... / evaluate (+ set_shard, set_learner, set_relay)
    relay:   weights_if_newer (one per host: each version leaves the learner once per host)
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np

__all__ = ["ActorCall", "EnvWorkerHandle", "LearnerHandle", "RelayHandle", "ShardHandle"]

T_co = TypeVar("T_co", covariant=True)


class ActorCall(Protocol[T_co]):
    """A call in flight: awaitable, or waited for with ``result``."""

    def __await__(self) -> Generator[Any, None, T_co]: ...

    def result(self, timeout: float | None = None) -> T_co: ...


class ShardHandle(Protocol):
    """A prioritized replay shard (:class:`~.replay_shard.ReplayShardActor`)."""

    def add(self, batch: dict[str, np.ndarray], priorities: Any = None) -> ActorCall[int]: ...

    def sample(self, batch_size: int | None = None) -> ActorCall[Any]: ...

    def sample_shared(
        self, reader: str, batch_size: int | None = None, count: int = 1
    ) -> ActorCall[Any]: ...

    def shared_stats(self) -> ActorCall[dict[str, Any]]: ...

    def update_priorities(
        self,
        indices: np.ndarray,
        priorities: np.ndarray,
        generations: np.ndarray,
        checksums: np.ndarray | None = None,
    ) -> ActorCall[int]: ...

    def added(self) -> ActorCall[int]: ...

    def stats(self) -> ActorCall[dict[str, float]]: ...

    def state_dict(self) -> ActorCall[dict[str, Any]]: ...

    def save_part(
        self,
        directory: str,
        name: str,
        budget_s: float | None = None,
        s_per_item: float | None = None,
        writers: int = 1,
    ) -> ActorCall[dict[str, Any]]: ...

    def load_part(self, directory: str, entry: dict[str, Any]) -> ActorCall[int]: ...

    def hand_over(self, new_ref: Any) -> ActorCall[dict[str, Any]]: ...

    def take_over(self, old_ref: Any, self_ref: Any) -> ActorCall[tuple[int, int]]: ...

    def idle_s(self) -> ActorCall[float]: ...

    def close(self) -> ActorCall[None]: ...


class LearnerHandle(Protocol):
    """The learner with its prefetcher and priority sender (:class:`~.learner.LearnerActor`)."""

    def start(self) -> ActorCall[None]: ...

    def stop(self, timeout_s: float = 30.0) -> ActorCall[dict[str, float]]: ...

    def set_shard(self, shard_id: int, handle: Any, lost: bool = False) -> ActorCall[None]: ...

    def weights_if_newer(self, version: int) -> ActorCall[bytes | None]: ...

    def versioned_weights_if_newer(self, version: int) -> ActorCall[tuple[int, bytes] | None]: ...

    def get_weights(self) -> ActorCall[tuple[int, dict[str, np.ndarray]]]: ...

    def state_dict(self) -> ActorCall[dict[str, Any]]: ...

    def save_part(self, directory: str, name: str) -> ActorCall[dict[str, Any]]: ...

    def load_part(self, directory: str, entry: dict[str, Any]) -> ActorCall[int]: ...

    def take_over(self, old_ref: Any) -> ActorCall[int]: ...

    def thread_error(self) -> ActorCall[str | None]: ...

    def progress(self) -> ActorCall[tuple[int, int]]: ...

    def stats(self) -> ActorCall[dict[str, Any]]: ...

    def close(self, timeout_s: float = 30.0) -> ActorCall[None]: ...


class EnvWorkerHandle(Protocol):
    """An env worker of the run's agent, or the evaluator (:class:`~.env_worker.EnvWorkerActor`)."""

    def sample_into(self, shard_ids: int | Sequence[int]) -> ActorCall[Any]: ...

    def sync_weights(self) -> ActorCall[int | None]: ...

    def evaluate(
        self,
        num_episodes: int,
        seed: int | None = None,
        max_steps: int | None = None,
        timeout_s: float | None = None,
        weights_above: float | None = None,
    ) -> ActorCall[dict[str, Any]]: ...

    def set_shard(self, shard_id: int, handle: Any, lost: bool = False) -> ActorCall[None]: ...

    def set_learner(self, handle: Any, lost: bool = False) -> ActorCall[None]: ...

    def set_relay(self, handle: Any, lost: bool = False) -> ActorCall[None]: ...

    def stats(self) -> ActorCall[dict[str, float]]: ...

    def transport(self) -> ActorCall[dict[str, Any]]: ...

    def close(self) -> ActorCall[None]: ...


class RelayHandle(Protocol):
    """One host's weights relay (:class:`~.weight_relay.WeightRelayActor`)."""

    def weights_if_newer(self, version: int, learner: Any) -> ActorCall[bytes | None]: ...

    def set_learner(self, handle: Any, lost: bool = False) -> ActorCall[None]: ...

    def stats(self) -> ActorCall[dict[str, float]]: ...

    def close(self) -> ActorCall[None]: ...
