"""The Ape-X execution plan, as the seed's operations on the driver's event loop.

RLlib's plan runs ``Concurrently([store_op, replay_op, update_op])``; here
each operation is one named piece (:mod:`.operations`, :mod:`.report`)::

    store   = StoreRollouts     ParallelRollouts(num_async=2) -> StoreToReplayBuffer
                                -> UpdateWorkerWeights(max_weight_sync_delay)
              env worker --rollout--> random shard (one hop); a RolloutSummary
              comes back here; a worker that produced max_weight_sync_delay
              steps pulls newer learner weights (one blob per version).
    replay  = ReplayAndUpdate   Replay(num_async=4) -> Enqueue(inqueue) ->
    update                      LearnerThread -> Dequeue -> update_priorities
              all inside the learner actor (prefetcher, learner thread,
              priority sender); the plan only starts and stops it.
    report  = Evaluation +      StandardMetricsReporting + greedy evaluation:
              Report            once report.min_iter_time_s *and*
                                report.timesteps_per_iteration are met, small
                                stats of every actor make one result dict.

and the upkeep jobs beside them: the learner's health (:mod:`.health`),
periodic checkpoints (:mod:`.checkpointing`), rebuilding a lost learner or
shard (:mod:`.recovery`), the optional ``min_replay_ratio`` pacing of env
workers (:mod:`.pacing`) and, in elastic runs, following the workers as they
join and retire (:mod:`.elastic`); lost env workers are handled by :mod:`.faults`.

Every piece is given the run's state (:mod:`.state`) and the collaborators
it calls, never the plan. Every call is an asyncio task awaited with
``asyncio.wait(FIRST_COMPLETED)`` (Dask's ``wait``/``as_completed`` do not
work on actor futures), each with a timeout.
"""

from __future__ import annotations

import asyncio
import queue
import time
from pathlib import Path
from typing import Any

from apex_dask.config import ApexConfig
from apex_dask.experiment.best_weights import BestWeights
from apex_dask.runtime.errors import (
    ApexRuntimeError,
    BackgroundTaskFailed,
    InvariantViolated,
    describe,
)
from apex_dask.runtime.orchestration.checkpointing import Checkpointer
from apex_dask.runtime.orchestration.connections import calls_in_flight, fit_connection_pool
from apex_dask.runtime.orchestration.elastic import Elasticity
from apex_dask.runtime.orchestration.evaluation import Evaluation
from apex_dask.runtime.orchestration.faults import FaultHandler
from apex_dask.runtime.orchestration.health import LearnerHealth
from apex_dask.runtime.orchestration.invariants import Invariants
from apex_dask.runtime.orchestration.launch import ActorSet
from apex_dask.runtime.orchestration.operations import ReplayAndUpdate, StoreRollouts
from apex_dask.runtime.orchestration.pacing import ReplayRatioPacer
from apex_dask.runtime.orchestration.recovery import Recovery
from apex_dask.runtime.orchestration.relays import WeightRelays
from apex_dask.runtime.orchestration.report import Report
from apex_dask.runtime.orchestration.state import RunState
from apex_dask.runtime.orchestration.tasks import Job, TaskSet

__all__ = ["ExecutionPlan"]


class ExecutionPlan:
    """Runs sessions of the plan over ``state``; state (counters, iteration) persists
    across sessions (a halt, then :meth:`run` again).

    ``actors`` creates and replaces actors on the cluster; without it (actors
    in this process) nothing lost can be rebuilt and a lost peer ends the run.
    """

    def __init__(
        self,
        *,
        config: ApexConfig,
        client: Any,
        run_id: str,
        state: RunState,
        actors: ActorSet | None,
        results: queue.Queue,
        min_replay_ratio: float | None = None,
        checkpoint_root: str | Path | None = None,
        best_weights_dir: str | Path | None = None,
    ) -> None:
        self.state, self.client, self.workers = state, client, config.workers
        self.timeout = t = float(config.topology.call_timeout_s)
        self.final: dict[str, float] | None = None
        # the next drain's time in all (ApexDriver.halt(timeout_s)); None: each step gets
        # the call timeout
        self.drain_s: float | None = None
        self.tasks = tasks = TaskSet(t, state.failures)
        self.grace_s = float(config.checkpoint.grace_s)
        # upkeep the operations lean on
        self.checkpoints = Checkpointer(state, tasks, config, checkpoint_root, t)
        self.replay_and_update = ReplayAndUpdate(state, t)
        self.recovery = Recovery(
            state,
            tasks,
            actors,
            client=client,
            timeout_s=t,
            latest=self.checkpoints.latest,
            start_learner=self.replay_and_update.start,
        )
        self.faults = FaultHandler(
            state, tasks, actors, client=client, check_rebuilds=self.recovery.check, timeout_s=t
        )
        self.pacer = ReplayRatioPacer(
            state, tasks, config.workers, min_replay_ratio, timeout_s=t, on_lost=self.recovery.soon
        )
        # the operations
        self.store = StoreRollouts(
            state, tasks, config.workers, on_failure=self.faults.env_failed, hold=self.pacer.hold
        )
        self.evaluation = Evaluation(
            state, tasks, config.eval, t, self.faults.env_failed, BestWeights(best_weights_dir)
        )
        self.report = Report(
            state,
            tasks,
            config.report,
            store=self.store,
            evaluation=self.evaluation,
            client=client,
            run_id=run_id,
            results=results,
            timeout_s=t,
            check_rebuilds=self.recovery.check,
            invariants=Invariants(config),
        )
        # what the loop ticks, in this order
        self.jobs: list[Job] = [
            self.evaluation,
            self.report,
            LearnerHealth(state, tasks, t),
            self.checkpoints,
            self.recovery,
            self.pacer,
        ]
        self.relays: WeightRelays | None = None
        if actors is not None and config.topology.weight_relays:
            self.relays = WeightRelays(state, tasks, actors, client=client, timeout_s=t)
            self.jobs.append(self.relays)
        if actors is not None and config.topology.elastic:
            self.jobs.append(
                Elasticity(
                    state,
                    tasks,
                    actors,
                    client=client,
                    run_id=run_id,
                    per_process=config.workers.per_process,
                    timeout_s=t,
                    start_env=self.store.start,
                    envs_changed=self.store.envs_changed,
                    stop_learner=self.replay_and_update.stop,
                    start_learner=self.replay_and_update.start,
                    evaluating=lambda: self.evaluation.pending,
                    relays_leaving=None if self.relays is None else self.relays.leave,
                )
            )

    async def run(self) -> None:
        """One session: start the operations, tick the jobs until ``state.halting``, drain."""
        s = self.state
        s.halting = False
        if s.t_start is None:
            s.t_start = time.monotonic()
        self.report.new_session()
        self.pacer.new_session()
        env_workers = max(len(s.slots), self.workers.num_workers)  # elastic: at most that many
        fit_connection_pool(self.client, calls_in_flight(self.workers, env_workers, len(s.shards)))
        await self.replay_and_update.start()
        for slot in s.slots:
            self.store.start(slot)
        try:
            while not s.halting:
                now = time.monotonic()
                for job in self.jobs:
                    job.tick(now)
                await self.tasks.step(0.1)
        except BaseException as exc:
            s.halting = True
            try:  # best effort: stop the learner thread, then re-raise
                await self._drain(min(self.timeout, 5.0))
            except Exception:
                pass
            if isinstance(exc, BackgroundTaskFailed | InvariantViolated):
                raise await self._saved(exc) from exc
            raise
        if self.drain_s is None:
            await self._drain(self.timeout)
        else:
            await self._drain_within(self.drain_s)

    async def _saved(self, exc: ApexRuntimeError) -> ApexRuntimeError:
        """A run a failed task or law ended: a checkpoint of what exists (within
        ``checkpoint.grace_s``) when the run has a checkpoint folder; ``exc`` says which."""
        if self.checkpoints.root is None:
            return exc
        try:
            path = await asyncio.wait_for(
                self.checkpoints.save("fault", within_s=self.grace_s), self.grace_s + 5.0
            )
            where = f"checkpoint {path} written"
        except Exception as error:
            where = f"no checkpoint written ({describe(error, 200)})"
        return type(exc)(getattr(exc, "task", getattr(exc, "law", "")), f"{exc}; {where}")

    async def _drain(self, timeout_s: float) -> None:
        """Let calls in flight finish (nothing new starts), stop the learner, take final stats."""
        self.state.halting = True
        await self.tasks.drain(timeout_s)
        learner = await self.replay_and_update.stop(timeout_s)
        self.final = await self.report.final(learner)

    async def _drain_within(self, budget_s: float) -> None:
        """:meth:`_drain` in ``budget_s`` in all: calls in flight get 40% of it, the
        learner's stop 60% of what is left, the final stats the rest."""
        self.state.halting = True
        end = time.monotonic() + budget_s
        self.checkpoints.abandon_periodic()  # the stop's own checkpoint follows
        await self.tasks.drain(0.4 * budget_s)
        learner = await self.replay_and_update.stop(max(0.2, 0.6 * (end - time.monotonic())))
        self.final = await self.report.final(learner, max(0.2, end - time.monotonic()))
