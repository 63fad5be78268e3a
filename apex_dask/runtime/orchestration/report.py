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
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from apex_dask.config.tree import ReportConfig
from apex_dask.experiment.results import IterationWindow, build_result
from apex_dask.runtime.actors.calls import actor_key, call_with_timeout
from apex_dask.runtime.errors import ApexRuntimeError, InvariantViolated
from apex_dask.runtime.observability.metrics import TOPIC, driver_names, make_message
from apex_dask.runtime.orchestration.evaluation import Evaluation
from apex_dask.runtime.orchestration.health import TaskHealth, learner_thread_failed
from apex_dask.runtime.orchestration.invariants import Invariants, Observed
from apex_dask.runtime.orchestration.operations import StoreRollouts
from apex_dask.runtime.orchestration.state import RunState
from apex_dask.runtime.orchestration.tasks import Job, TaskSet


def relay_totals(relays: dict[str, tuple[Any, dict[str, float]]]) -> dict[str, float]:
    """``relay/<counter>`` summed over the hosts' relays, and ``relay/count``: one row
    holds the same keys however many hosts (per-host counters: each relay's ``stats``)."""
    out: dict[str, float] = {"relay/count": float(len(relays))}
    for _, stats in relays.values():
        for name, value in stats.items():
            parts = name.split("/")
            if len(parts) == 3 and parts[0] == "relay" and parts[2] != "version":
                out[f"relay/{parts[2]}"] = out.get(f"relay/{parts[2]}", 0.0) + float(value)
    return out


__all__ = ["Report"]

Stats = tuple[IterationWindow, dict[str, Any], list[dict], list[dict], Observed]


class Report(Job):
    """report: gathers every actor's stats once an iteration is due; puts the result dict
    on ``results`` and logs it to the scheduler (the ``/apex`` page)."""

    name = "driver.report"

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
        invariants: Invariants | None = None,
    ) -> None:
        super().__init__(tasks)
        self.state, self.cfg, self.store, self.evaluation = state, cfg, store, evaluation
        self.invariants = invariants
        self.health = TaskHealth(state.failures, state.note)
        self.client, self.run_id, self.results = client, run_id, results
        self.timeout = timeout_s
        self.check_rebuilds = check_rebuilds
        self._window_t0 = time.monotonic()
        self._probe, self._probed = False, 0.0

    def new_session(self) -> None:
        self.store.take_window()
        self._window_t0 = time.monotonic()
        if self.invariants is not None:
            self.invariants.new_session(self._window_t0)

    def due(self, now: float) -> bool:
        self._probe = False
        if (
            now - self._window_t0 >= self.cfg.min_iter_time_s
            and self.store.window.steps >= self.cfg.timesteps_per_iteration
        ):
            return True
        # no iteration ends (a stalled run makes no env steps): the laws are checked anyway
        check = self.invariants
        if check is None or now - max(self._window_t0, self._probed) < check.stall_s / 2:
            return False
        self._probe = True
        return True

    def start(self, now: float) -> Awaitable[Stats]:
        if self._probe:  # no result: the stats for the laws only
            self._probed = now
            return self._gather(IterationWindow(wall_s=now - self._window_t0), probe=True)
        window = self.store.take_window()
        window.wall_s, self._window_t0 = now - self._window_t0, now
        return self._gather(window)

    async def _gather(self, window: IterationWindow, probe: bool = False) -> Stats:
        s = self.state
        rollouts = s.rollouts.snapshot()  # before the shards' stats: each was stored by then
        asked = self.state.learner
        try:
            learner = await call_with_timeout(asked.stats(), self.timeout)
        except Exception as exc:
            learner = None
            deadline = time.monotonic() + self.timeout
            while True:  # a rebuild may need a second try (a worker chosen for it left too)
                rebuilt = await self.check_rebuilds()
                if rebuilt or self.state.learner is not asked or time.monotonic() > deadline:
                    break
                await asyncio.sleep(1.0)
            if rebuilt or self.state.learner is not asked:  # lost and rebuilt: ask the new one
                learner = await call_with_timeout(self.state.learner.stats(), self.timeout)
            if learner is None:
                raise ApexRuntimeError(
                    f"the learner is unreachable ({type(exc).__name__}: {exc}); stopping the run"
                ) from None
        if learner.get("thread_error"):
            raise learner_thread_failed(learner["thread_error"])
        learner_key = actor_key(s.learner)
        shard_keys = [actor_key(h) for h in s.shards]
        env_keys = {slot.index: actor_key(slot.handle) for slot in s.slots}
        shards, envs = await self.small_stats()
        relays = await self.relay_stats()
        observed = Observed(
            now=time.monotonic(),
            learner_key=learner_key,
            ledger=list(learner.get("priority_ledger") or []),
            shard_keys=shard_keys,
            env_keys=env_keys,
            rollouts=rollouts,
            rollouts_in_flight={slot.index: slot.in_flight for slot in s.slots},
            env_versions={
                slot.index: e.get(f"env/{slot.index}/weights_version")
                for slot, e in zip(s.slots, envs, strict=False)
            },
            env_steps={
                slot.index: e.get(f"env/{slot.index}/steps_sampled")
                for slot, e in zip(s.slots, envs, strict=False)
            },
            probe=probe,
            relays=relays,
        )
        return window, learner, shards, envs, observed

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

    async def relay_stats(
        self, timeout_s: float | None = None
    ) -> dict[str, tuple[Any, dict[str, float]]]:
        """Per host, ``(relay key, its stats)`` of each weights relay that answered (within
        ``timeout_s``, default the call timeout)."""
        relays = list(self.state.relays.values())
        bound = self.timeout if timeout_s is None else timeout_s

        async def one(h: Any) -> Any:
            return await call_with_timeout(h.stats(), bound)

        got = await asyncio.gather(*(one(r.handle) for r in relays), return_exceptions=True)
        return {r.host: (r.key, g) for r, g in zip(relays, got, strict=True) if isinstance(g, dict)}

    async def done(self, result: Stats | None, exc: BaseException | None) -> None:  # type: ignore[override]
        if exc is not None:
            raise exc
        assert result is not None
        window, learner, shards, envs, observed = result
        s = self.state
        last = s.last_shards
        s.last_learner = learner
        s.last_shards = [new or (last[k] if k < len(last) else {}) for k, new in enumerate(shards)]
        if observed.probe:  # the laws only; the finished evaluation stays for the next result
            out = self.result(window, learner, shards, envs, None)
            self._check(out, learner, observed, self.evaluation.finished, envs)
            return
        evaluated = self.evaluation.take()
        # numbered when handed out: a checkpoint written while the stats were asked holds
        # the rows before it (a resume from it writes this one again, no gap)
        s.counters.next_row()
        out = self.result(window, learner, shards, envs, evaluated)
        s.rate_base = learner
        self._check(out, learner, observed, evaluated, envs)
        try:
            # the learner's, shards' and env workers' own names come from them
            msg = make_message(self.run_id, "driver", driver_names(out, [learner, *shards, *envs]))
            sent = self.client.scheduler.log_event(topic=TOPIC, msg=msg)
            await asyncio.wait_for(sent, min(self.timeout, 10.0))
        except Exception:  # metrics must never stop (or hold up) training
            pass
        self.results.put(out)

    def _check(
        self,
        out: dict[str, float],
        learner: dict[str, Any],
        observed: Observed,
        evaluated: dict[str, Any] | None,
        envs: Sequence[dict] = (),
    ) -> None:
        """The health of this result: task failures added up, the laws checked (a
        checker that fails is counted and restarted; ``strict`` ends the run)."""
        s = self.state
        self.health.see(observed.learner_key, "the learner", learner)
        for (i, key), stats in zip(observed.env_keys.items(), envs, strict=False):
            self.health.see(key, f"env worker {i}", stats)
        for host, (key, stats) in observed.relays.items():
            self.health.see(key, f"the weights relay on {host}", stats)
        out.update(relay_totals(observed.relays))
        if s.evaluator is not None:
            who = actor_key(s.evaluator.handle)
            self.health.see(who, "the evaluator", self.evaluation.task_failures)
        if self.invariants is not None:
            observed.evaluated = evaluated is not None
            observed.eval_duration_s = float((evaluated or {}).get("duration_s", 0.0) or 0.0)
            c = s.counters
            observed.disturbed = (*c.faults.metrics().values(), *c.elastic.metrics().values())
            try:
                s.failures.check("driver.invariants")
                self.invariants.check(out, observed)
            except InvariantViolated:
                raise
            except Exception as exc:  # the checker's own bug: counted, the run goes on
                s.failures.failed("driver.invariants", exc)
            out.update(self.invariants.metrics())
        out.update(self.health.metrics())

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
            per_worker_keys=self.cfg.per_worker_keys,
        )

    async def final(self, learner: dict, timeout_s: float | None = None) -> dict[str, float]:
        """Stats taken after a halt, when every hop's counters agree (each actor's asked
        with ``timeout_s``, default the call timeout; one that does not answer counts 0)."""
        (shards, envs), relays = await asyncio.gather(
            self.small_stats(timeout_s), self.relay_stats(timeout_s)
        )
        window = self.store.take_window()
        window.wall_s = time.monotonic() - self._window_t0
        out = self.result(window, learner, shards, envs, self.evaluation.last)
        out.update(relay_totals(relays))  # halted: every blob the learner sent has arrived
        self.health.see(actor_key(self.state.learner), "the learner", learner)
        if self.invariants is not None:
            out.update(self.invariants.metrics())
        out.update(self.health.metrics())
        return out
