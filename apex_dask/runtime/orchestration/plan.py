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
from apex_dask.experiment.results import IterationWindow, build_result
from apex_dask.runtime.actors.calls import call_with_timeout
from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.observability.metrics import TOPIC, make_message
from apex_dask.runtime.orchestration.checkpointing import Checkpointer
from apex_dask.runtime.orchestration.faults import EnvSlot, FaultHandler
from apex_dask.runtime.orchestration.health import LearnerHealth
from apex_dask.runtime.orchestration.pacing import ReplayRatioPacer
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
        ks = [int(k) for k in self.plan.rng.integers(len(self.plan.shards), size=n)]
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


class Report:
    """report: one result dict per iteration, plus the periodic greedy evaluation."""

    def __init__(self, plan: ExecutionPlan) -> None:
        self.plan = plan
        self.iteration = 0
        self.prev_learner: dict[str, Any] | None = None
        self.eval_result: dict[str, Any] | None = None  # finished this iteration
        self.last_eval: dict[str, Any] | None = None
        self.eval_history: list[dict[str, Any]] = []
        self.notes: list[str] = []  # things that went wrong without ending the run
        self._window_t0 = time.monotonic()
        self._last_eval = -float("inf")
        self._report_pending = False
        self._eval_pending = False

    def note(self, message: str) -> None:
        """Record a problem that does not end the run (kept: the last 20)."""
        self.notes = [*self.notes[-19:], message]

    def new_session(self) -> None:
        self.plan.store.window, self._window_t0 = IterationWindow(), time.monotonic()

    def tick(self) -> None:
        self._maybe_evaluate()
        self._maybe_report()
        self.plan.health.tick()

    # -- evaluation ----------------------------------------------------------
    def _maybe_evaluate(self) -> None:
        ev, slot = self.plan.cfg.eval, self.plan.evaluator
        if slot is None or ev.episodes <= 0 or self._eval_pending or slot.replacing:
            return
        now = time.monotonic()
        if now - self._last_eval < ev.interval_s:
            return
        self._last_eval, self._eval_pending = now, True
        seed = int(self.plan.rng.integers(2**31))
        # the evaluator stops itself at eval.timeout_s; this bound catches a hung env step
        self.plan.tasks.spawn(
            lambda: slot.handle.evaluate(ev.episodes, seed, ev.max_episode_steps, ev.timeout_s),
            lambda t: self._evaluated(slot, t, now),
            timeout=ev.timeout_s + self.plan.timeout,
        )

    def _evaluated(self, slot: EnvSlot, task: asyncio.Future, t0: float) -> None:
        self._eval_pending = False
        exc = _error(task)
        if isinstance(exc, TimeoutError):  # reported as a timed-out evaluation; the run goes on
            self.eval_result = {"return_mean": float("nan"), "timed_out": True}
            return
        if exc is not None:
            self.plan.faults.env_failed(slot, exc, relaunch=False)
            return
        self.eval_result = self.last_eval = {
            **task.result(),
            "duration_s": time.monotonic() - t0,
        }
        self.eval_history.append(
            {
                "timesteps_total": self.plan.store.steps_total,
                "return_mean": float(self.last_eval["return_mean"]),
                "weights_version": int(self.last_eval.get("weights_version", -1)),
            }
        )

    # -- results ---------------------------------------------------------------
    def _maybe_report(self) -> None:
        rep, store = self.plan.cfg.report, self.plan.store
        now = time.monotonic()
        wall = now - self._window_t0
        if self._report_pending or wall < rep.min_iter_time_s:
            return
        if store.window.steps < rep.timesteps_per_iteration:
            return
        window, store.window = store.window, IterationWindow()
        window.wall_s, self._window_t0 = wall, now
        self.iteration += 1
        self._report_pending = True
        self.plan.tasks.add(self._gather(), lambda t: self._emit(window, t))

    async def _gather(self) -> tuple[dict, list[dict], list[dict]]:
        try:
            learner = await call_with_timeout(self.plan.learner.stats(), self.plan.timeout)
        except Exception as exc:
            raise ApexRuntimeError(
                f"the learner is unreachable ({type(exc).__name__}: {exc}); its worker was "
                "probably lost, stopping the run"
            ) from None
        if learner.get("thread_error"):
            raise ApexRuntimeError(f"the learner thread failed: {learner['thread_error']}")
        shards, envs = await self.small_stats()
        return learner, shards, envs

    async def small_stats(self) -> tuple[list[dict], list[dict]]:
        """Every shard's and env worker's metric-named stats ({} for one that failed)."""
        p = self.plan
        handles = [*p.shards, *(s.handle for s in p.slots)]

        async def one(h: Any) -> Any:
            return await call_with_timeout(h.stats(), p.timeout)

        got = await asyncio.gather(*(one(h) for h in handles), return_exceptions=True)
        got = [g if isinstance(g, dict) else {} for g in got]
        return got[: len(p.shards)], got[len(p.shards) :]

    async def _emit(self, window: IterationWindow, task: asyncio.Future) -> None:
        self._report_pending = False
        exc = _error(task)
        if exc is not None:
            raise exc
        learner, shards, envs = task.result()
        result = self.result(window, learner, shards, envs, self.eval_result)
        self.eval_result = None
        self.prev_learner = learner
        self.plan.pacer.trained(int(learner["learner/steps_trained"]))
        try:
            msg = make_message(self.plan.run_id, "driver", result)
            await self.plan.client.scheduler.log_event(topic=TOPIC, msg=msg)
        except Exception:  # metrics must never stop training
            pass
        self.plan.results.put(result)

    def result(
        self,
        window: IterationWindow,
        learner: dict,
        shards: list[dict],
        envs: list[dict],
        eval_result: dict[str, Any] | None,
    ) -> dict[str, float]:
        """One flat result dict from this window's stats (names: docs/metrics.md)."""
        p = self.plan
        return build_result(
            iteration=self.iteration,
            time_s=time.monotonic() - (p.t_start or 0.0),
            window=window,
            steps_total=p.store.steps_total,
            learner=learner,
            prev_learner=self.prev_learner,
            shards=shards,
            envs=envs,
            acting_versions=[s.version for s in p.slots],
            weight_syncs=p.store.weight_syncs,
            eval_result=eval_result,
            extra=p.faults.counters(),
        )

    async def final(self, learner: dict) -> dict[str, float]:
        """Stats taken after a halt, when every hop's counters agree."""
        shards, envs = await self.small_stats()
        window, self.plan.store.window = self.plan.store.window, IterationWindow()
        window.wall_s = time.monotonic() - self._window_t0
        return self.result(window, learner, shards, envs, self.last_eval)


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
        shard_addresses: list[str],
        results: queue.Queue,
        replace_env_worker: Callable[[EnvSlot, dict[str, Any]], Any],
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
        self.faults = FaultHandler(self, shard_addresses, replace_env_worker)
        self.health = LearnerHealth(self)
        self.checkpoints = Checkpointer(self, checkpoint_root)

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
