"""Flow and fault counters: their names and their arithmetic, in one place.

Every hop of the plan counts what it passed on, so a result can say where
an item went::

    env worker --rollouts_sent--> shard (rollouts_stored)
    shard --batches_sampled--> learner (batches_received -> in_queue -> trained)
    learner --priority_updates_sent--> shard (priority_updates_applied)

After a halt nothing is in transit, so ``flow/rollouts_sent`` =
``flow/rollouts_stored`` + ``flow/rollouts_lost`` and ``flow/batches_received``
= ``flow/batches_trained`` + ``flow/batches_in_queue``. An actor that dies takes
its counters with it: the driver keeps the last ones it saw
(:class:`RetiredFlow`) and adds them to the live actors' totals, so no total
ever goes backwards.

Each actor kind has one typed counter set (:class:`ShardFlow`,
:class:`LearnerFlow`), the faults a run survived have one
(:class:`FaultCounters`); each turns itself into metric-named numbers
(``docs/metrics.md``) and back. Nothing else builds or parses these names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

__all__ = [
    "ElasticCounters",
    "ROLLOUTS_LOST",
    "ROLLOUTS_SENT",
    "FaultCounters",
    "LearnerFlow",
    "RetiredFlow",
    "ShardFlow",
    "rollouts_lost",
]

ROLLOUTS_SENT = "flow/rollouts_sent"
ROLLOUTS_LOST = "flow/rollouts_lost"


class _Counters:
    """A dataclass of integer counters, each named ``<prefix><field>`` as a metric."""

    prefix = ""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(cls.prefix + f.name for f in fields(cls))  # type: ignore[arg-type]

    def metrics(self) -> dict[str, float]:
        return {self.prefix + k: float(v) for k, v in asdict(self).items()}  # type: ignore[call-overload]

    @classmethod
    def from_metrics(cls, stats: Mapping[str, Any]) -> Any:
        """The counters in metric-named ``stats`` (0 where one is missing)."""
        return cls(**{f.name: int(stats.get(cls.prefix + f.name, 0)) for f in fields(cls)})  # type: ignore[arg-type]

    def add(self, other: Any) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class ShardFlow(_Counters):
    """One replay shard's hop counters: ``add``, non-None ``sample`` and
    ``update_priorities`` calls (``applied``: the update reached at least one of
    its items; ``stale``: none, every item had left its slot, or the shard was
    rebuilt since and never held it). As metrics they are per shard
    (``replay/<k>/<name>``); summed over shards they are ``flow/<name>``."""

    prefix = "flow/"
    rollouts_stored: int = 0
    batches_sampled: int = 0
    priority_updates_applied: int = 0
    priority_updates_stale: int = 0

    def shard_metrics(self, shard_id: int) -> dict[str, float]:
        """As ``replay/<k>/<name>``."""
        return {f"replay/{shard_id}/{k}": float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_shard_metrics(cls, shard_id: int, stats: Mapping[str, Any]) -> ShardFlow:
        """Read back what :meth:`shard_metrics` wrote (0 where missing)."""
        return cls(
            **{f.name: int(stats.get(f"replay/{shard_id}/{f.name}", 0)) for f in fields(cls)}
        )

    @classmethod
    def total(cls, shards: list[Mapping[str, Any]]) -> ShardFlow:
        """The sum over shards ``0..n-1`` of their ``replay/<k>/*`` counters."""
        out = cls()
        for k, stats in enumerate(shards):
            out.add(cls.from_shard_metrics(k, stats))
        return out


@dataclass
class LearnerFlow(_Counters):
    """The learner's hop counters (``flow/<name>``): batches taken from shards,
    waiting in its inqueue, trained; priority updates sent and failed; batches
    lost (sample requests that failed)."""

    prefix = "flow/"
    batches_received: int = 0
    batches_in_queue: int = 0
    batches_trained: int = 0
    priority_updates_sent: int = 0
    priority_updates_failed: int = 0
    batches_lost: int = 0

    def unconsumed(self) -> int:
        """Batches received and not trained (they die with the learner)."""
        return max(0, self.batches_received - self.batches_trained)


@dataclass
class FaultCounters(_Counters):
    """The faults a run survived (all 0 in the in-process runner)."""

    prefix = "faults/"
    env_workers_replaced: int = 0
    rollouts_failed: int = 0
    shards_restored: int = 0
    replay_items_lost: int = 0
    learner_restored: int = 0
    env_errors: int = 0
    """Env errors the env workers and the evaluator survived (raised, hung, non-finite);
    each env was closed and made again (``workers.restart_failed_envs``)."""


@dataclass
class ElasticCounters(_Counters):
    """What an elastic run (``topology.elastic``) did as Dask workers joined and left on
    purpose; none of it is a fault (all 0 in the in-process runner and without elastic)."""

    prefix = "elastic/"
    env_workers_added: int = 0
    env_workers_retired: int = 0
    shards_moved: int = 0
    replay_items_moved: int = 0
    """Items the moved shards held at the move (each new shard held as many)."""
    learner_moved: int = 0


@dataclass
class RetiredFlow:
    """The last counters of lost actors, added to the live ones' totals.

    A lost learner's unconsumed batches (received, not trained, as of its
    last stats) count as ``flow/batches_lost`` too.
    """

    shards: ShardFlow
    learner: LearnerFlow

    @classmethod
    def empty(cls) -> RetiredFlow:
        return cls(ShardFlow(), LearnerFlow())

    def retire_shard(self, last: ShardFlow) -> None:
        self.shards.add(last)

    def retire_learner(self, last: LearnerFlow) -> None:
        """A lost learner's counters; what sat in its inqueue is lost, not queued."""
        self.learner.add(replace(last, batches_in_queue=0))
        self.learner.batches_lost += last.unconsumed()

    def metrics(self) -> dict[str, float]:
        """``flow/*`` amounts to add to the live actors' totals (zeros left out)."""
        both = {**self.shards.metrics(), **self.learner.metrics()}
        return {k: v for k, v in both.items() if v}

    def add_to(self, result: dict[str, float]) -> None:
        for name, value in self.metrics().items():
            result[name] = result.get(name, 0.0) + value

    def state_dict(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.metrics().items()}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> RetiredFlow:
        return cls(ShardFlow.from_metrics(state), LearnerFlow.from_metrics(state))


def rollouts_lost(result: Mapping[str, float]) -> float:
    """sent - stored, never below 0: the rollouts whose call failed and that no shard
    stored, once nothing is in transit."""
    return max(0.0, result.get(ROLLOUTS_SENT, 0.0) - result.get("flow/rollouts_stored", 0.0))
