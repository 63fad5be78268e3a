"""report: one result dict per iteration (``StandardMetricsReporting``).

Once ``report.min_iter_time_s`` *and* ``report.timesteps_per_iteration`` are
met, small stats of every actor make one result dict (names:
``docs/metrics.md``); the lost actors' last counters (``state.counters.retired``)
are added to the live ones, so every total only grows. The stats gathered
are kept in the run state (``last_learner``, ``last_shards``): what a lost
actor had counted, for the recovery, and how far the learner is, for the pacer.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Awaitable, Callable
from typing import Any

from apex_dask.config.tree import ReportConfig
from apex_dask.experiment.results import IterationWindow, build_result
from apex_dask.runtime.actors.calls import call_with_timeout
from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.observability.metrics import TOPIC, make_message
from apex_dask.runtime.orchestration.evaluation import Evaluation
from apex_dask.runtime.orchestration.operations import StoreRollouts
from apex_dask.runtime.orchestration.state import RunState
from apex_dask.runtime.orchestration.tasks import Job, TaskSet

__all__ = ["Report"]

Stats = tuple[IterationWindow, dict[str, Any], list[dict], list[dict]]


class Report(Job):
    """report: gathers every actor's stats once an iteration is due; puts the result dict
    on ``results`` and logs it to the scheduler (the ``/apex`` page)."""

    def __init__(
        self,
        state: RunState,
        tasks: TaskSet,
        cfg: ReportConfig,
        *,
        store: StoreRollouts,
        evaluation: Evaluation,
        client: Any,
        run_id: str,
        results: queue.Queue,
        timeout_s: float,
        check_rebuilds: Callable[[], Awaitable[bool]],
    ) -> None:
        super().__init__(tasks)
        self.state, self.cfg, self.store, self.evaluation = state, cfg, store, evaluation
        self.client, self.run_id, self.results = client, run_id, results
        self.timeout = timeout_s
        self.check_rebuilds = check_rebuilds
        self._window_t0 = time.monotonic()

    def new_session(self) -> None:
        self.store.take_window()
        self._window_t0 = time.monotonic()

    def due(self, now: float) -> bool:
        return (
            now - self._window_t0 >= self.cfg.min_iter_time_s
            and self.store.window.steps >= self.cfg.timesteps_per_iteration
        )

    def start(self, now: float) -> Awaitable[Stats]:
        window = self.store.take_window()
        window.wall_s, self._window_t0 = now - self._window_t0, now
        self.state.counters.iteration += 1
        return self._gather(window)

    async def _gather(self, window: IterationWindow) -> Stats:
        asked = self.state.learner
        try:
            learner = await call_with_timeout(asked.stats(), self.timeout)
        except Exception as exc:
            learner = None
            rebuilt = await self.check_rebuilds()
            if rebuilt or self.state.learner is not asked:  # lost and rebuilt: ask the new one
                learner = await call_with_timeout(self.state.learner.stats(), self.timeout)
            if learner is None:
                raise ApexRuntimeError(
                    f"the learner is unreachable ({type(exc).__name__}: {exc}); stopping the run"
                ) from None
        if learner.get("thread_error"):
            raise ApexRuntimeError(f"the learner thread failed: {learner['thread_error']}")
        shards, envs = await self.small_stats()
        return window, learner, shards, envs

    async def small_stats(self, timeout_s: float | None = None) -> tuple[list[dict], list[dict]]:
        """Every shard's and env worker's metric-named stats ({} for one that failed or did
        not answer within ``timeout_s``, default the call timeout)."""
        s = self.state
        handles = [*s.shards, *(slot.handle for slot in s.slots)]
        bound = self.timeout if timeout_s is None else timeout_s

        async def one(h: Any) -> Any:
            return await call_with_timeout(h.stats(), bound)

        got = await asyncio.gather(*(one(h) for h in handles), return_exceptions=True)
        got = [g if isinstance(g, dict) else {} for g in got]
        return got[: len(s.shards)], got[len(s.shards) :]

    async def done(self, result: Stats | None, exc: BaseException | None) -> None:  # type: ignore[override]
        if exc is not None:
            raise exc
        assert result is not None
        window, learner, shards, envs = result
        s = self.state
        last = s.last_shards
        s.last_learner = learner
        s.last_shards = [new or (last[k] if k < len(last) else {}) for k, new in enumerate(shards)]
        out = self.result(window, learner, shards, envs, self.evaluation.take())
        s.rate_base = learner
        try:
            msg = make_message(self.run_id, "driver", out)
            sent = self.client.scheduler.log_event(topic=TOPIC, msg=msg)
            await asyncio.wait_for(sent, min(self.timeout, 10.0))
        except Exception:  # metrics must never stop (or hold up) training
            pass
        self.results.put(out)

    def result(
        self,
        window: IterationWindow,
        learner: dict,
        shards: list[dict],
        envs: list[dict],
        eval_result: dict[str, Any] | None,
    ) -> dict[str, float]:
        """One flat result dict from this window's stats (names: docs/metrics.md)."""
        s, c = self.state, self.state.counters
        return build_result(
            iteration=c.iteration,
            time_s=s.elapsed_s(),
            window=window,
            steps_total=c.steps_total,
            learner=learner,
            prev_learner=s.rate_base,
            shards=shards,
            envs=envs,
            acting_versions=[slot.version for slot in s.slots],
            weight_syncs=c.weight_syncs,
            eval_result=eval_result,
            extra={**c.driver_metrics(), **s.worker_counts()},
            retired=c.retired,
        )

    async def final(self, learner: dict, timeout_s: float | None = None) -> dict[str, float]:
        """Stats taken after a halt, when every hop's counters agree (each actor's asked
        with ``timeout_s``, default the call timeout; one that does not answer counts 0)."""
        shards, envs = await self.small_stats(timeout_s)
        window = self.store.take_window()
        window.wall_s = time.monotonic() - self._window_t0
        return self.result(window, learner, shards, envs, self.evaluation.last)
