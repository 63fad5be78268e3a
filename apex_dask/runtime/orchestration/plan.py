"""The Ape-X execution plan, as the seed's operations on the driver's event loop.

RLlib's plan runs ``Concurrently([store_op, replay_op, update_op])``; here
each operation is one named piece, each call a task with its own handler::

    store   = StoreRollouts     ParallelRollouts(num_async=2) -> StoreToReplayBuffer
                                -> UpdateWorkerWeights(max_weight_sync_delay)
              env worker --rollout--> random shard (one hop); a RolloutSummary
              comes back here; a worker that produced max_weight_sync_delay
              steps pulls newer learner weights (one blob per version).
    replay  = ReplayAndUpdate   Replay(num_async=4) -> Enqueue(inqueue) ->
    update                      LearnerThread -> Dequeue -> update_priorities
              all inside the learner actor (prefetcher, learner thread,
              priority sender); the plan only starts and stops it.
    report  = Report            StandardMetricsReporting + greedy evaluation:
              once report.min_iter_time_s *and* report.timesteps_per_iteration
              are met, small stats of every actor make one result dict.

Every call is an asyncio task awaited with ``asyncio.wait(FIRST_COMPLETED)``
(Dask's ``wait``/``as_completed`` do not work on actor futures), each with a
timeout. Lost actors are handled by :mod:`.faults`; the optional
``min_replay_ratio`` pacing of env workers by :mod:`.pacing`.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from apex_dask.algo.exploration import lowest_epsilon_workers
from apex_dask.algo.results import derive_seed
from apex_dask.experiment.messages import RolloutSummary
from apex_dask.experiment.results import IterationWindow
from apex_dask.runtime.actors.calls import call_with_timeout
from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.orchestration.checkpointing import Checkpointer
from apex_dask.runtime.orchestration.faults import EnvSlot, FaultHandler
from apex_dask.runtime.orchestration.health import LearnerHealth
from apex_dask.runtime.orchestration.pacing import ReplayRatioPacer
from apex_dask.runtime.orchestration.recovery import Recovery
from apex_dask.runtime.orchestration.report import Report
from apex_dask.runtime.orchestration.tasks import TaskSet

__all__ = ["EnvSlot", "ExecutionPlan"]


def _error(task: asyncio.Future) -> BaseException | None:
    return asyncio.CancelledError() if task.cancelled() else task.exception()


class StoreRollouts:
    """store: rollouts env worker -> random shard, then the weight sync."""

    def __init__(self, plan: ExecutionPlan) -> None:
        self.plan = plan
        self.w = plan.cfg.workers
        self.steps_total = 0
        self.rollouts_returned = 0  # rollouts that returned sample_into calls stored
        self.weight_syncs = 0
        self.window = IterationWindow()
        self.lowest = set(lowest_epsilon_workers(len(plan.slots)))

    def start(self, slot: EnvSlot) -> None:
        """Keep ``rollouts_in_flight`` rollouts going; a worker without weights syncs first
        (so no rollout is acted with a random net, as in the in-process runner)."""
        if slot.version < 0:
            self._sync(slot, then_launch=True)
        else:
            self.fill(slot)

    def fill(self, slot: EnvSlot) -> None:
        while slot.in_flight < self.w.rollouts_in_flight:
            self.launch(slot)

    def launch(self, slot: EnvSlot) -> None:
        """One call of ``rollouts_per_call`` rollouts, each to a uniformly random shard."""
        n = self.w.rollouts_per_call
        shards = self.plan.live_shards()
        ks = [shards[int(i)] for i in self.plan.rng.integers(len(shards), size=n)]
        arg = ks[0] if n == 1 else ks
        slot.in_flight += 1
        self.plan.tasks.spawn(lambda: slot.handle.sample_into(arg), lambda t: self._stored(slot, t))

    def _stored(self, slot: EnvSlot, task: asyncio.Future) -> None:
        slot.in_flight -= 1
        exc = _error(task)
        if exc is not None:
            self.plan.faults.env_failed(slot, exc, relaunch=True)
            return
        s: RolloutSummary = task.result()
        self.rollouts_returned += s.rollouts
        self.steps_total += s.steps
        self.window.steps += s.steps
        slot.steps_since_sync += s.steps
        slot.version = s.weights_version
        if slot.index in self.lowest:
            self.window.episode_returns += s.episode_returns
            self.window.episode_lengths += s.episode_lengths
        if self.plan.halting:
            return
        if not self.plan.pacer.hold(slot):
            self.launch(slot)
        self._maybe_sync(slot)

    def _maybe_sync(self, slot: EnvSlot) -> None:
        if slot.syncing or slot.replacing or slot.steps_since_sync < self.w.max_weight_sync_delay:
            return
        if time.monotonic() >= slot.retry_sync_at:
            self._sync(slot, then_launch=False)

    def _sync(self, slot: EnvSlot, then_launch: bool) -> None:
        slot.syncing = True
        self.plan.tasks.spawn(
            lambda: slot.handle.sync_weights(), lambda t: self._synced(slot, t, then_launch)
        )

    def _synced(self, slot: EnvSlot, task: asyncio.Future, then_launch: bool) -> None:
        slot.syncing = False
        exc = _error(task)
        if exc is not None:
            self.plan.faults.env_failed(slot, exc, relaunch=False)
            return
        version = task.result()
        if version is None:  # the learner has nothing newer yet
            slot.retry_sync_at = time.monotonic() + 0.1
        else:
            self.weight_syncs += 1
            slot.steps_since_sync = 0
            slot.version = int(version)
        if then_launch and not self.plan.halting:
            self.fill(slot)


class ReplayAndUpdate:
    """replay + update: they live in the learner actor; the plan starts and stops them."""

    def __init__(self, plan: ExecutionPlan) -> None:
        self.plan = plan

    async def start(self) -> None:
        try:
            await call_with_timeout(self.plan.learner.start(), self.plan.timeout)
        except Exception as exc:
            raise ApexRuntimeError(
                f"cannot start the learner on {self.plan.learner_address}: "
                f"{type(exc).__name__}: {exc}"
            ) from None

    async def stop(self, timeout_s: float) -> dict[str, Any]:
        """Drain the learner (final stats: every ``flow/*`` counter agrees)."""
        try:
            return await call_with_timeout(self.plan.learner.stop(), timeout_s)
        except Exception as exc:
            raise ApexRuntimeError(
                f"cannot stop the learner ({type(exc).__name__}: {exc}); was its worker lost?"
            ) from None


class ExecutionPlan:
    """Runs sessions of the plan; state (counters, iteration) persists across sessions."""

    def __init__(
        self,
        *,
        config: Any,
        client: Any,
        run_id: str,
        learner: Any,
        shards: list[Any],
        slots: list[EnvSlot],
        evaluator: EnvSlot | None,
        learner_address: str,
        results: queue.Queue,
        replace_env_worker: Callable[[EnvSlot, dict[str, Any]], Any],
        actors: Any = None,
        seed: int = 0,
        min_replay_ratio: float | None = None,
        checkpoint_root: str | None = None,
    ) -> None:
        self.cfg = config
        self.client = client
        self.run_id = run_id
        self.learner = learner
        self.shards = shards
        self.slots = slots
        self.evaluator = evaluator
        self.learner_address = learner_address
        self.results = results
        self.timeout = float(config.topology.call_timeout_s)
        self.rng = np.random.default_rng(derive_seed(seed, "driver"))
        self.halting = False
        self.t_start: float | None = None
        self.final: dict[str, float] | None = None
        self.tasks = TaskSet(self.timeout)
        self.store = StoreRollouts(self)
        self.replay_and_update = ReplayAndUpdate(self)
        self.report = Report(self)
        self.pacer = ReplayRatioPacer(self, min_replay_ratio)
        self.faults = FaultHandler(self, replace_env_worker)
        self.health = LearnerHealth(self)
        self.checkpoints = Checkpointer(self, checkpoint_root)
        self.recovery = Recovery(self, actors)
        self.missing_shards: set[int] = set()  # lost, being rebuilt: no rollouts go there

    def live_shards(self) -> list[int]:
        """Shard ids rollouts may go to (all while none is being rebuilt)."""
        live = [k for k in range(len(self.shards)) if k not in self.missing_shards]
        return live or list(range(len(self.shards)))

    @property
    def iteration(self) -> int:
        return self.report.iteration

    async def run(self) -> None:
        """One session: start the three operations, loop until :attr:`halting`, then drain."""
        self.halting = False
        if self.t_start is None:
            self.t_start = time.monotonic()
        self.report.new_session()
        self.pacer.new_session()
        await self.replay_and_update.start()
        for slot in self.slots:
            self.store.start(slot)
        try:
            while not self.halting:
                self.report.tick()
                self.checkpoints.tick()
                self.recovery.tick()
                await self.tasks.step(0.1)
        except BaseException:
            self.halting = True
            try:  # best effort: stop the learner thread, then re-raise
                await self._drain(min(self.timeout, 5.0))
            except Exception:
                pass
            raise
        await self._drain(self.timeout)

    async def _drain(self, timeout_s: float) -> None:
        """Let calls in flight finish (nothing new starts), stop the learner, take final stats."""
        self.halting = True
        await self.tasks.drain(timeout_s)
        learner = await self.replay_and_update.stop(timeout_s)
        self.final = await self.report.final(learner)
