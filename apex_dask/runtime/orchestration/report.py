"""report: one result dict per iteration, plus the periodic greedy evaluation.

Once ``report.min_iter_time_s`` *and* ``report.timesteps_per_iteration`` are
met, small stats of every actor make one result dict (names:
``docs/metrics.md``); the lost actors' last counters are added to the live
ones (:mod:`.recovery`), so every total only grows.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from apex_dask.experiment.results import IterationWindow, build_result
from apex_dask.runtime.actors.calls import call_with_timeout
from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.observability.metrics import TOPIC, make_message

if TYPE_CHECKING:
    from apex_dask.runtime.orchestration.faults import EnvSlot
    from apex_dask.runtime.orchestration.plan import ExecutionPlan

__all__ = ["Report"]


def _error(task: asyncio.Future) -> BaseException | None:
    return asyncio.CancelledError() if task.cancelled() else task.exception()


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
        asked = self.plan.learner
        try:
            learner = await call_with_timeout(asked.stats(), self.plan.timeout)
        except Exception as exc:
            learner = None
            rebuilt = await self.plan.recovery.check()
            if rebuilt or self.plan.learner is not asked:  # lost and rebuilt: ask the new one
                learner = await call_with_timeout(self.plan.learner.stats(), self.plan.timeout)
            if learner is None:
                raise ApexRuntimeError(
                    f"the learner is unreachable ({type(exc).__name__}: {exc}); stopping the run"
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
        self.plan.recovery.last_learner = learner
        self.plan.recovery.last_shards = [
            s or old for s, old in zip(shards, self._padded(len(shards)), strict=True)
        ]
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

    def _padded(self, n: int) -> list[dict[str, float]]:
        last = self.plan.recovery.last_shards
        return [last[k] if k < len(last) else {} for k in range(n)]

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
        out = build_result(
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
            extra={**p.faults.counters(), **p.recovery.counters()},
        )
        p.recovery.add_retired(out)
        out["flow/rollouts_lost"] = max(
            0.0, out["flow/rollouts_sent"] - out["flow/rollouts_stored"]
        )
        return out

    async def final(self, learner: dict) -> dict[str, float]:
        """Stats taken after a halt, when every hop's counters agree."""
        shards, envs = await self.small_stats()
        window, self.plan.store.window = self.plan.store.window, IterationWindow()
        window.wall_s = time.monotonic() - self._window_t0
        return self.result(window, learner, shards, envs, self.last_eval)
