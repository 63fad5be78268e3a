"""The run's state, each piece kept once, with the few methods that change it.

::

    state = RunState(learner=..., learner_address=..., shards=[...], slots=[...],
                     evaluator=slot_or_None, seed=cfg.seed)
    state.live_shards()               # shard ids rollouts may go to now
    state.replace_shard(k, handle)    # a rebuilt shard: the one place shard handles change
    state.replace_learner(h, addr, updates)   # a rebuilt learner: likewise
    state.snapshot() / state.restore(d)       # the driver's part of a checkpoint

What each piece is, who reads it and who may change it is the "Run state"
table of ``docs/architecture.md``. The plan's operations and upkeep jobs are
given this object (and the few collaborators they call), never the plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from apex_dask.experiment.flow import ROLLOUTS_SENT, ElasticCounters, FaultCounters, RetiredFlow
from apex_dask.experiment.stats import derive_seed
from apex_dask.runtime.actors.calls import actor_key
from apex_dask.runtime.actors.contracts import EnvWorkerHandle, LearnerHandle, ShardHandle
from apex_dask.runtime.actors.supervision import TaskFailures

__all__ = ["EnvSlot", "RelaySlot", "RolloutLedger", "RunCounters", "RunState"]


@dataclass
class EnvSlot:
    """The driver's view of one env worker actor (its Future is kept: dropping it kills it).

    ``index`` -1 is the evaluator. ``version`` -1: the actor has no weights yet.
    The store operation changes the flow fields (``in_flight``, ``syncing``,
    ``retry_sync_at``, ``steps_since_sync``, ``version``); the fault handler
    ``replacing`` and, through :meth:`rebind`, the actor itself.
    """

    index: int
    future: Any
    handle: EnvWorkerHandle
    address: str
    exploration: float
    steps_since_sync: int = 0
    version: int = -1
    syncing: bool = False
    retry_sync_at: float = 0.0
    in_flight: int = 0
    replacing: bool = False
    retiring: bool = False  # its Dask worker is leaving: no new rollouts, then it is closed
    joined_at: float | None = None  # wall time its Dask worker joined, until its first rollout

    def rebind(self, future: Any, handle: EnvWorkerHandle, address: str) -> None:
        """A new actor for this slot (it has no weights yet: it syncs before acting)."""
        self.future, self.handle, self.address = future, handle, address
        self.version, self.steps_since_sync = -1, 0


@dataclass
class RelaySlot:
    """The driver's view of one host's weights relay (its Future is kept)."""

    host: str
    future: Any
    handle: Any
    ref: Any  # what env workers are given
    address: str

    @property
    def key(self) -> Any:
        return self.future.key


@dataclass
class ShardRollouts:
    """The rollouts the driver sent to one replay shard actor (``key``): acknowledged
    (their call returned: the shard stored them), in flight, and ``uncertain``: in
    flight when this actor replaced a lost one (each may have been stored by either)."""

    key: Any
    acked: int = 0
    in_flight: int = 0
    uncertain: int = 0


class RolloutLedger:
    """Per shard id, the rollouts sent to its current actor (the rollouts law of
    :mod:`.invariants`: a shard holds every rollout it acknowledged)."""

    def __init__(self, keys: list[Any]) -> None:
        self.shards = [ShardRollouts(k) for k in keys]

    def launched(self, ks: list[int]) -> None:
        for k in ks:
            self.shards[k].in_flight += 1

    def returned(self, ks: list[int], stored: int) -> None:
        """A call for ``ks`` returned: the first ``stored`` of them were stored."""
        for j, k in enumerate(ks):
            self.shards[k].in_flight -= 1
            self.shards[k].acked += int(j < stored)

    def failed(self, ks: list[int]) -> None:
        for k in ks:
            self.shards[k].in_flight -= 1

    def replaced(self, k: int, key: Any) -> None:
        """Shard ``k`` is the actor ``key`` from now on."""
        old = self.shards[k]
        self.shards[k] = ShardRollouts(key, 0, old.in_flight, old.in_flight)

    def snapshot(self) -> list[tuple[Any, int, int]]:
        """Per shard id: ``(actor key, acknowledged, uncertain)``."""
        return [(x.key, x.acked, x.uncertain) for x in self.shards]


@dataclass
class RunCounters:
    """The driver's counters; all of them continue across a resume."""

    steps_total: int = 0  # env steps of every rollout a shard stored (timesteps_total)
    rollouts_returned: int = 0  # rollouts that returned sample_into calls stored
    weight_syncs: int = 0
    iteration: int = 0
    row_steps: int = 0  # timesteps_total of the last row handed out (iteration's)
    faults: FaultCounters = field(default_factory=FaultCounters)
    elastic: ElasticCounters = field(default_factory=ElasticCounters)
    retired: RetiredFlow = field(default_factory=RetiredFlow.empty)  # lost actors' last flow

    def next_row(self) -> None:
        """A row is handed out: it is numbered now and its step is the one a resumed run's
        TensorBoard purges past (``row_steps``)."""
        self.iteration += 1
        self.row_steps = self.steps_total

    def driver_metrics(self) -> dict[str, float]:
        """The fault counters and ``flow/rollouts_sent``: rollout calls that finished, a
        lost env worker's included (its own counter died with it)."""
        sent = self.rollouts_returned + self.faults.rollouts_failed
        return {**self.faults.metrics(), **self.elastic.metrics(), ROLLOUTS_SENT: float(sent)}


class RunState:
    """Handles, counters and run-wide values of one run (see the module docstring)."""

    def __init__(
        self,
        *,
        learner: LearnerHandle,
        learner_address: str,
        shards: list[ShardHandle],
        slots: list[EnvSlot],
        evaluator: EnvSlot | None,
        seed: int = 0,
    ) -> None:
        # handles: changed only by replace_shard / replace_learner (and EnvSlot.rebind)
        self.learner = learner
        self.learner_address = learner_address
        self.shards = list(shards)
        self.slots = slots
        self.evaluator = evaluator
        self.missing_shards: set[int] = set()  # lost, being rebuilt: no rollouts go there
        # weights relays by host (runtime/orchestration/relays.py keeps them)
        self.relays: dict[str, RelaySlot] = {}
        self.rollouts = RolloutLedger([actor_key(h) for h in self.shards])
        self.failures = TaskFailures("the driver")  # the driver's supervised tasks
        self.dask_workers = 0  # Dask workers alive, as the newest check saw them
        self.changes: list[str] = []  # elastic joins, retirements and moves, one line each
        # counters and run-wide values
        self.counters = RunCounters()
        self.rng = np.random.default_rng(derive_seed(seed, "driver"))
        self.halting = False
        self.t_start: float | None = None
        self.eval_history: list[dict[str, Any]] = []
        self.notes: list[str] = []  # problems that did not end the run (the last 20)
        # the newest stats a report gathered: what a lost actor's counters were
        self.last_learner: dict[str, Any] = {}
        self.last_shards: list[dict[str, float]] = []
        # the learner stats this iteration's rates count from (None: from zero)
        self.rate_base: dict[str, float] | None = None

    # -- handles ------------------------------------------------------------------
    def live_shards(self) -> list[int]:
        """Shard ids rollouts may go to (all while none is being rebuilt)."""
        live = [k for k in range(len(self.shards)) if k not in self.missing_shards]
        return live or list(range(len(self.shards)))

    def shard_lost(self, k: int) -> None:
        """Shard ``k`` is being rebuilt: rollouts go to the others meanwhile."""
        self.missing_shards.add(k)

    def replace_shard(self, k: int, handle: ShardHandle) -> None:
        """Shard ``k`` is ``handle`` from now on (a rebuilt shard)."""
        self.shards[k] = handle
        self.missing_shards.discard(k)
        self.rollouts.replaced(k, actor_key(handle))

    def replace_learner(self, handle: LearnerHandle, address: str, updates: int) -> None:
        """The learner is ``handle`` on ``address`` from now on, having made ``updates``."""
        self.learner, self.learner_address = handle, address
        self.restart_rates(updates)

    def restart_rates(self, updates: int) -> None:
        """Rates of the next result count from a learner that has made ``updates``."""
        self.rate_base = {"learner/updates": float(updates), "learner/grad_total_s": 0.0}

    def add_slot(self, slot: EnvSlot) -> None:
        """A new env worker (an elastic join); slots stay ordered by index."""
        self.slots = sorted([*self.slots, slot], key=lambda x: x.index)

    def remove_slot(self, slot: EnvSlot) -> None:
        """An env worker that was retired with its Dask worker."""
        self.slots = [x for x in self.slots if x is not slot]

    def worker_counts(self) -> dict[str, float]:
        """``workers/env_workers`` (live env worker actors) and ``workers/dask_workers``."""
        return {
            "workers/env_workers": float(len(self.slots)),
            "workers/dask_workers": float(self.dask_workers),
        }

    def change(self, line: str) -> None:
        """Record one elastic join, retirement or move (the CLI prints each once)."""
        self.changes.append(line)

    def env_slots(self) -> list[EnvSlot]:
        """Every env worker's slot, the evaluator's last."""
        return [*self.slots, *([self.evaluator] if self.evaluator is not None else [])]

    def handles(self) -> list[Any]:
        """Every actor handle: learner, shards, env workers, evaluator."""
        return [self.learner, *self.shards, *(s.handle for s in self.env_slots())]

    # -- run-wide values -----------------------------------------------------------
    def note(self, message: str) -> None:
        """Record a problem that does not end the run (kept: the last 20)."""
        self.notes = [*self.notes[-19:], message]

    def elapsed_s(self) -> float:
        return 0.0 if self.t_start is None else time.monotonic() - self.t_start

    def snapshot(self) -> dict[str, Any]:
        """The driver's part of a checkpoint: counters, iteration, eval history, RNG."""
        c = self.counters
        return {
            "steps_total": c.steps_total,
            "weight_syncs": c.weight_syncs,
            "iteration": c.iteration,
            "row_steps": c.row_steps,
            "time_s": self.elapsed_s(),
            "eval_history": list(self.eval_history),
            "faults": c.faults.metrics(),
            "elastic": c.elastic.metrics(),
            "retired": c.retired.state_dict(),
            "rng": self.rng.bit_generator.state,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`snapshot` (before the plan runs)."""
        c = self.counters
        c.steps_total = int(state["steps_total"])
        c.weight_syncs = int(state["weight_syncs"])
        c.iteration = int(state["iteration"])
        c.row_steps = int(state.get("row_steps", c.steps_total))  # older checkpoints: none
        c.faults = FaultCounters.from_metrics(state["faults"])
        c.elastic = ElasticCounters.from_metrics(state.get("elastic", {}))
        c.retired = RetiredFlow.from_state_dict(state.get("retired", {}))
        self.eval_history = list(state["eval_history"])
        self.t_start = time.monotonic() - float(state["time_s"])
        self.rng.bit_generator.state = state["rng"]
