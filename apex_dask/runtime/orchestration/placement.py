"""Where each Ape-X actor goes on the Dask cluster: a pure function of the worker list.

Rules (``docs/architecture.md``):

- **Learner**: the worker named by ``topology.learner_worker`` (name or
  address) if given; else the first worker advertising a ``GPU`` resource
  (``dask worker --resources GPU=1``); else the first worker (workers sorted
  by name, numeric names numerically, then address).
- **Replay shards** (``replay.placement``):
  ``learner_process`` (default): on the learner's worker, so sampling and
  priority updates are local calls in one process; ``learner_host``:
  round-robin over the *other* workers on the learner's host (own processes,
  as RLlib placed its shards), the learner's worker if it has no peer there;
  ``spread``: round-robin over all workers, starting after the learner.
- **Env workers**: round-robin over the workers holding neither the learner
  nor (``learner_host``) a shard; failing that, over the workers other than
  the learner's, or over all workers when the learner's is the only one.
- **Evaluator** (greedy evaluation): on the env-worker worker holding the
  fewest env workers (the first such).

Every actor is then pinned with ``workers=[address]``: Dask resources steer
placement only at creation and unpinned actors land unpredictably.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from apex_dask.runtime.errors import ApexRuntimeError

__all__ = [
    "REPLAY_PLACEMENTS",
    "Placement",
    "WorkerInfo",
    "only_workers",
    "plan_placement",
    "workers_from_scheduler_info",
]

REPLAY_PLACEMENTS = ("learner_process", "learner_host", "spread")
"""Values of ``replay.placement``: where the replay shards go relative to the learner."""


@dataclass(frozen=True)
class WorkerInfo:
    """What placement needs to know about one Dask worker."""

    address: str
    name: str
    host: str = ""
    resources: Mapping[str, float] = field(default_factory=dict)
    # the worker process's id: a worker restarted by its nanny may come back at the
    # same address, without the actors it held
    uid: str = field(default="", compare=False)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("uid")
        d["resources"] = dict(self.resources)
        return d


@dataclass(frozen=True)
class Placement:
    """The worker chosen for each actor."""

    learner: WorkerInfo
    shards: list[WorkerInfo]
    env_workers: list[WorkerInfo | None]  # by slot index; None: an empty slot (elastic)
    evaluator: WorkerInfo

    def as_dict(self) -> dict[str, Any]:
        """``{"learner": {...}, "shards": [{...}], "env_workers": [{...}], "evaluator": {...}}``
        with ``address``, ``name``, ``host``, ``resources`` for each."""
        return {
            "learner": self.learner.as_dict(),
            "shards": [w.as_dict() for w in self.shards],
            "env_workers": [None if w is None else w.as_dict() for w in self.env_workers],
            "evaluator": self.evaluator.as_dict(),
        }

    def env_worker(self, env_index: int) -> WorkerInfo:
        """Where env worker ``env_index`` (-1: the evaluator) is."""
        where = self.evaluator if env_index < 0 else self.env_workers[env_index]
        assert where is not None, f"env worker slot {env_index} is empty"
        return where

    def moved(self, env_index: int, where: WorkerInfo | None) -> Placement:
        """This placement with env worker ``env_index`` (-1: the evaluator) on ``where``
        (None: the slot is emptied, its env worker retired)."""
        if env_index < 0:
            assert where is not None
            return replace(self, evaluator=where)
        env_workers = list(self.env_workers)
        env_workers += [None] * (env_index + 1 - len(env_workers))
        env_workers[env_index] = where
        return replace(self, env_workers=env_workers)

    def shard_moved(self, shard: int, where: WorkerInfo) -> Placement:
        """This placement with replay shard ``shard`` on ``where``."""
        shards = list(self.shards)
        shards[shard] = where
        return replace(self, shards=shards)

    def learner_moved(self, where: WorkerInfo) -> Placement:
        """This placement with the learner on ``where``."""
        return replace(self, learner=where)


def workers_from_scheduler_info(info: Mapping[str, Any]) -> list[WorkerInfo]:
    """Workers from ``client.scheduler_info()``, sorted (see :func:`_order`)."""
    workers = [
        WorkerInfo(
            address=addr,
            name=str(w.get("name", addr)),
            host=str(w.get("host", "")),
            resources=dict(w.get("resources") or {}),
            uid=str(w.get("id", "")),
        )
        for addr, w in info.get("workers", {}).items()
    ]
    return sorted(workers, key=_order)


def _order(w: WorkerInfo) -> tuple:
    name = w.name
    return (0, int(name), "", w.address) if name.isdigit() else (1, 0, name, w.address)


def _find(workers: Iterable[WorkerInfo], wanted: str) -> WorkerInfo | None:
    for w in workers:
        if wanted in (w.name, w.address):
            return w
    return None


def only_workers(workers: list[WorkerInfo], wanted: Sequence[str] | None) -> list[WorkerInfo]:
    """The workers named (by name or address) in ``wanted``; all of them when None.
    Raises :class:`ApexRuntimeError` when a wanted worker is not on the cluster."""
    if wanted is None:
        return workers
    chosen = []
    for name in wanted:
        found = _find(workers, str(name))
        if found is None:
            raise ApexRuntimeError(f"worker {name!r} is not on the Dask cluster (or has left)")
        if found not in chosen:
            chosen.append(found)
    if not chosen:
        raise ApexRuntimeError("the list of workers to use is empty; give at least one")
    return chosen


def plan_placement(
    workers: list[WorkerInfo],
    *,
    num_shards: int,
    num_env_workers: int,
    learner_worker: str | None = None,
    replay_placement: str = "learner_process",
    colocate_shards: bool | None = None,
) -> Placement:
    """Choose a worker for the learner, each shard, each env worker and the evaluator.

    ``replay_placement`` is one of :data:`REPLAY_PLACEMENTS`. Raises
    :class:`ApexRuntimeError` when there are no workers, ``learner_worker``
    names none of them, or ``replay_placement`` is unknown. ``colocate_shards``
    (the older form) True means ``learner_process``, False ``spread``.
    """
    if colocate_shards is not None:
        replay_placement = "learner_process" if colocate_shards else "spread"
    if replay_placement not in REPLAY_PLACEMENTS:
        raise ApexRuntimeError(
            f"replay.placement={replay_placement!r} is unknown; choose one of: "
            + ", ".join(REPLAY_PLACEMENTS)
        )
    if not workers:
        raise ApexRuntimeError("the Dask cluster has no workers; start some with `dask worker`")
    workers = sorted(workers, key=_order)
    if learner_worker is not None:
        learner = _find(workers, learner_worker)
        if learner is None:
            names = ", ".join(w.name for w in workers[:8])
            raise ApexRuntimeError(
                f"topology.learner_worker={learner_worker!r} matches no worker name or "
                f"address (workers: {names})"
            )
    else:
        gpus = [w for w in workers if float(w.resources.get("GPU", 0)) > 0]
        learner = gpus[0] if gpus else workers[0]
    others = [w for w in workers if w.address != learner.address] or [learner]
    if replay_placement == "learner_process":
        shards = [learner] * num_shards
    elif replay_placement == "learner_host":
        peers = [w for w in others if w.host == learner.host and w is not learner] or [learner]
        shards = [peers[k % len(peers)] for k in range(num_shards)]
        holding = {w.address for w in shards}
        others = [w for w in others if w.address not in holding] or others
    else:  # spread
        start = workers.index(learner) + 1
        ring = workers[start:] + workers[:start]
        shards = [ring[k % len(ring)] for k in range(num_shards)]
    env_workers = [others[i % len(others)] for i in range(num_env_workers)]
    load = {w.address: 0 for w in others}
    for w in env_workers:
        load[w.address] += 1
    evaluator = min(others, key=lambda w: load[w.address])
    return Placement(learner=learner, shards=shards, env_workers=env_workers, evaluator=evaluator)
