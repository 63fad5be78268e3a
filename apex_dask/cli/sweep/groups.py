"""Which Dask workers each of K concurrent trials gets: a pure function of the worker list.

::

    groups = split_workers(workers, k=2)    # workers: placement.WorkerInfo, sorted
    groups[0].learner, groups[0].workers

Rules:

- Each slot's **learner** worker is chosen first: workers with a ``GPU``
  resource before others, and a host that holds no learner yet before one
  that does (learners apart where the cluster allows), then the host with
  the most free workers, then the worker order.
- The other workers are dealt out one at a time to the slot with the fewest,
  preferring a slot whose learner shares the worker's host (its env workers
  near it), so the slots' sizes differ by one at most.
- With fewer workers than slots, slots share: slot ``i`` gets the group of
  slot ``i mod n`` (the trials then run side by side on the same workers).

The trial's actors are pinned to its group (``ApexDriver(workers=...)``) and its
learner to the group's learner (``topology.learner_worker``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from apex_dask.runtime.orchestration.placement import WorkerInfo

__all__ = ["WorkerGroup", "split_workers"]


@dataclass(frozen=True)
class WorkerGroup:
    """The workers of one trial slot; ``learner`` is one of ``workers``."""

    learner: WorkerInfo
    workers: tuple[WorkerInfo, ...]

    @property
    def addresses(self) -> list[str]:
        return [w.address for w in self.workers]

    def describe(self) -> str:
        names = ", ".join(w.name for w in self.workers)
        return f"learner on {self.learner.name} ({self.learner.host or '?'}); workers {names}"


def _gpu(w: WorkerInfo) -> bool:
    return float(w.resources.get("GPU", 0)) > 0


def split_workers(workers: list[WorkerInfo], k: int) -> list[WorkerGroup]:
    """``k`` groups of ``workers`` (see the module docstring); ``workers`` in their order."""
    if k < 1:
        raise ValueError("k must be >= 1")
    if not workers:
        raise ValueError("no workers to split")
    n = len(workers)
    if n < k:
        own = [WorkerGroup(w, (w,)) for w in workers]
        return [own[i % n] for i in range(k)]
    order = {w.address: i for i, w in enumerate(workers)}
    free = list(workers)
    learners: list[WorkerInfo] = []
    for _ in range(k):
        taken = Counter(w.host for w in learners)
        left = Counter(w.host for w in free)
        best = min(
            free,
            key=lambda w: (not _gpu(w), taken[w.host], -left[w.host], order[w.address]),
        )
        learners.append(best)
        free.remove(best)
    members: list[list[WorkerInfo]] = [[w] for w in learners]
    for w in free:
        slot = min(
            range(k),
            key=lambda i: (len(members[i]), learners[i].host != w.host, i),
        )
        members[slot].append(w)
    return [
        WorkerGroup(learners[i], tuple(sorted(members[i], key=lambda w: order[w.address])))
        for i in range(k)
    ]
