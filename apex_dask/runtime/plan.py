"""The Ape-X execution plan as one asyncio task on the driver's client loop.

What runs concurrently (RLlib's ``Concurrently([store, replay, update])``):

1. **store**: each env worker keeps ``rollouts_in_flight`` ``sample_into(k)``
   calls running, ``k`` a uniformly random shard; the rollout goes env worker
   -> shard directly and only a summary comes back here.
2. **weights**: once an env worker has produced ``max_weight_sync_delay``
   steps since its last sync, ``sync_weights()`` makes it pull the learner's
   newer weights (if any; learner -> env worker, one blob per version).
3. **replay + update**: inside the learner actor (prefetcher, learner thread,
   priorities back to the source shard); the plan only starts and stops it.
4. **report**: once ``report.min_iter_time_s`` *and*
   ``report.timesteps_per_iteration`` are met, the stats of the learner, every
   shard and every env worker are gathered (small dicts) and one result dict
   is emitted. **eval**: every ``eval.interval_s`` the evaluator plays greedy
   episodes; its result joins the next result dicts.

Every call is a task awaited with ``asyncio.wait(FIRST_COMPLETED)`` (Dask's
``wait``/``as_completed`` do not work on actor futures), each with a timeout.
An env worker whose Dask worker was lost is re-created on a surviving worker
(``faults/env_workers_replaced``); a lost or failed learner ends the run with
an :class:`ApexRuntimeError`.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from apex_dask.algo.exploration import lowest_epsilon_workers
from apex_dask.algo.results import derive_seed
from apex_dask.runtime.calls import call_with_timeout
from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.metrics import TOPIC, make_message
from apex_dask.runtime.report import IterationWindow, build_result

__all__ = ["EnvSlot", "ExecutionPlan"]


@dataclass
class EnvSlot:
    """The driver's view of one env worker actor (its Future is kept: dropping it kills it)."""

    index: int
    future: Any
    handle: Any
    address: str
    epsilon: float
    steps_since_sync: int = 0
    version: int = -1
    syncing: bool = False
    retry_sync_at: float = 0.0
    in_flight: int = 0
    replacing: bool = False


def _is_lost(exc: BaseException) -> bool:
    """Errors that mean the peer (its worker) is gone, rather than a bug in the env."""
    if isinstance(exc, OSError | TimeoutError | asyncio.TimeoutError):
        return True
    return "was lost" in str(exc) or "Unable to contact" in str(exc)


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
    ) -> None:
        self.cfg = config
        self.client = client
        self.run_id = run_id
        self.learner = learner
        self.shards = shards
        self.slots = slots
        self.evaluator = evaluator
        self.learner_address = learner_address
        self.shard_addresses = shard_addresses
        self.results = results
        self.replace_env_worker = replace_env_worker
        self.timeout = float(config.topology.call_timeout_s)
        self.rng = np.random.default_rng(derive_seed(seed, "driver"))
        self.lowest = set(lowest_epsilon_workers(len(slots)))
        self.min_replay_ratio = min_replay_ratio
        self._trained = 0  # learner's steps trained, as last seen
        self._held: list[EnvSlot] = []
        self._progress_pending = False
        self._last_poll = -float("inf")
        self.halting = False
        self.iteration = 0
        self.steps_total = 0
        self.weight_syncs = 0
        self.env_workers_replaced = 0
        self.rollouts_failed = 0
        self.eval_result: dict[str, Any] | None = None  # finished this iteration
        self.last_eval: dict[str, Any] | None = None
        self.eval_time_s = 0.0
        self._eval_t0 = 0.0
        self.prev_learner: dict[str, Any] | None = None
        self.t_start: float | None = None
        self.final: dict[str, float] | None = None
        self._tasks: dict[asyncio.Future, tuple[str, Any]] = {}
        self._window = IterationWindow()
        self._window_t0 = 0.0
        self._last_eval = -float("inf")
        self._report_pending = False
        self._eval_pending = False

    # ---------------------------------------------------------------- session
    async def run(self) -> None:
        """One session: start everything, loop until :attr:`halting`, then drain."""
        self.halting = False
        now = time.monotonic()
        if self.t_start is None:
            self.t_start = now
        self._window, self._window_t0 = IterationWindow(), now
        self._held, self._progress_pending = [], False
        try:
            await call_with_timeout(self.learner.start(), self.timeout)
        except Exception as exc:
            raise ApexRuntimeError(
                f"cannot start the learner on {self.learner_address}: {type(exc).__name__}: {exc}"
            ) from None
        for slot in self.slots:
            for _ in range(self.cfg.workers.rollouts_in_flight):
                self._launch_rollout(slot)
        try:
            while not self.halting:
                self._maybe_launch_eval()
                self._maybe_launch_report()
                if not self._tasks:
                    await asyncio.sleep(0.05)
                    continue
                done, _ = await asyncio.wait(
                    list(self._tasks), timeout=0.1, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    await self._handle(task, *self._tasks.pop(task))
        except BaseException:
            self.halting = True
            try:  # best effort: stop the learner thread, then re-raise
                await self._drain(min(self.timeout, 5.0))
            except Exception:
                pass
            raise
        self.halting = True
        await self._drain(self.timeout)

    async def _drain(self, timeout_s: float) -> None:
        """Let calls in flight finish (nothing new starts), stop the learner, take final stats."""
        deadline = time.monotonic() + timeout_s
        while self._tasks and time.monotonic() < deadline:
            done, _ = await asyncio.wait(
                list(self._tasks), timeout=1.0, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                await self._handle(task, *self._tasks.pop(task))
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        try:
            final = await self._call(lambda: self.learner.stop(), timeout_s)
        except Exception as exc:
            raise ApexRuntimeError(
                f"cannot stop the learner ({type(exc).__name__}: {exc}); was its worker lost?"
            ) from None
        shards, envs = await self._gather_small_stats()
        self._window.wall_s = time.monotonic() - self._window_t0
        self.final = self._result(self._window, final, shards, envs, self.last_eval)

    # ---------------------------------------------------------------- launches
    async def _call(self, make: Callable[[], Any], timeout_s: float | None = None) -> Any:
        """Make an actor call *inside* the task and await it with a timeout.

        A handle whose worker was lost raises on attribute access; made here,
        that error becomes the task's, handled like any failed call.
        """
        fut = make()
        if timeout_s is None:
            return await fut
        return await call_with_timeout(fut, timeout_s)

    def _spawn(self, kind: str, info: Any, make: Callable[[], Any], timeout: bool = True) -> None:
        coro = self._call(make, self.timeout if timeout else None)
        self._tasks[asyncio.ensure_future(coro)] = (kind, info)

    def _launch_rollout(self, slot: EnvSlot) -> None:
        k = int(self.rng.integers(len(self.shards)))
        slot.in_flight += 1
        handle = slot.handle
        self._spawn("rollout", slot, lambda: handle.sample_into(k))

    def _maybe_launch_sync(self, slot: EnvSlot) -> None:
        delay = self.cfg.workers.max_weight_sync_delay
        if slot.syncing or slot.replacing or slot.steps_since_sync < delay:
            return
        if time.monotonic() < slot.retry_sync_at:
            return
        slot.syncing = True
        handle = slot.handle
        self._spawn("sync", slot, lambda: handle.sync_weights())

    def _maybe_launch_eval(self) -> None:
        ev = self.cfg.eval
        slot = self.evaluator
        if slot is None or ev.episodes <= 0 or self._eval_pending or slot.replacing:
            return
        now = time.monotonic()
        if now - self._last_eval < ev.interval_s:
            return
        self._last_eval = now
        self._eval_t0 = now
        self._eval_pending = True
        seed = int(self.rng.integers(2**31))
        handle = slot.handle  # no timeout: evaluation may take long; it never blocks the loop
        self._spawn("eval", slot, lambda: handle.evaluate(ev.episodes, seed), timeout=False)

    def _maybe_launch_report(self) -> None:
        rep = self.cfg.report
        now = time.monotonic()
        wall = now - self._window_t0
        if self._report_pending or wall < rep.min_iter_time_s:
            return
        if self._window.steps < rep.timesteps_per_iteration:
            return
        window, self._window = self._window, IterationWindow()
        window.wall_s, self._window_t0 = wall, now
        self.iteration += 1
        self._report_pending = True
        self._tasks[asyncio.ensure_future(self._gather_report())] = ("report", window)

    # ---------------------------------------------------------------- handlers
    async def _handle(self, task: asyncio.Future, kind: str, info: Any) -> None:
        exc = task.exception() if not task.cancelled() else asyncio.CancelledError()
        if kind == "rollout":
            slot: EnvSlot = info
            slot.in_flight -= 1
            if exc is not None:
                self._env_failed(slot, exc, relaunch=True)
                return
            self._on_rollout(slot, task.result())
        elif kind == "sync":
            slot = info
            slot.syncing = False
            if exc is not None:
                self._env_failed(slot, exc, relaunch=False)
                return
            version = task.result()
            if version is None:  # the learner has nothing newer yet
                slot.retry_sync_at = time.monotonic() + 0.1
            else:
                self.weight_syncs += 1
                slot.steps_since_sync = 0
                slot.version = int(version)
        elif kind == "eval":
            self._eval_pending = False
            self.eval_time_s += time.monotonic() - self._eval_t0
            if exc is None:
                self.eval_result = self.last_eval = task.result()
            else:
                self._env_failed(info, exc, relaunch=False)
        elif kind == "progress":
            self._progress_pending = False
            if exc is not None:
                raise ApexRuntimeError(
                    f"the learner is unreachable ({type(exc).__name__}: {exc}); stopping the run"
                )
            self._on_progress(task.result())
        elif kind == "replace":
            if exc is not None:
                raise exc
            self._after_replace(info, task.result())
        elif kind == "report":
            self._report_pending = False
            if exc is not None:
                raise exc
            await self._emit(info, *task.result())

    def _on_rollout(self, slot: EnvSlot, s: dict[str, Any]) -> None:
        steps = int(s["steps"])
        self.steps_total += steps
        self._window.steps += steps
        slot.steps_since_sync += steps
        slot.version = int(s["weights_version"])
        if slot.index in self.lowest:
            self._window.episode_returns += s["episode_returns"]
            self._window.episode_lengths += s["episode_lengths"]
        if not self.halting:
            if self._below_min_ratio():
                self._held.append(slot)  # relaunched once the learner has caught up
            else:
                self._launch_rollout(slot)
            self._maybe_launch_sync(slot)
            self._maybe_poll_progress()

    # --------------------------------------------------------- min replay ratio
    def _below_min_ratio(self) -> bool:
        """With ``min_replay_ratio`` rho: True while training has started and
        transitions trained < rho * (env steps sampled - slack) (env workers then
        wait). The slack, four fragments per rollout in flight, lets env workers
        run a little ahead: a learner capped at the same ratio by
        ``max_replay_ratio`` (which counts items *stored*, a few n-step tails
        fewer) then never waits on env workers that wait on it (measured: one
        fragment of slack left the learner idle 24% of the time, four: 2%)."""
        rho = self.min_replay_ratio
        if rho is None or self._trained <= 0:
            return False
        w = self.cfg.workers
        slack = 4 * len(self.slots) * w.rollouts_in_flight * w.rollout_fragment_length
        return self._trained < rho * (self.steps_total - slack)

    def _maybe_poll_progress(self) -> None:
        """Ask the learner how far it is, at most every 20 ms (50 ms while nobody waits)."""
        if self.min_replay_ratio is None or self._progress_pending:
            return
        now = time.monotonic()
        gap = 0.02 if self._held else 0.05
        if not self._held and now - self._last_poll < gap:
            return
        delay = max(0.0, self._last_poll + gap - now)
        self._progress_pending = True

        async def poll() -> int:
            if delay:
                await asyncio.sleep(delay)
            self._last_poll = time.monotonic()
            return await call_with_timeout(self.learner.progress(), self.timeout)

        self._tasks[asyncio.ensure_future(poll())] = ("progress", None)

    def _on_progress(self, trained: int) -> None:
        self._trained = max(self._trained, trained)
        if not self._below_min_ratio():
            held, self._held = self._held, []
            if not self.halting:
                for slot in held:
                    self._launch_rollout(slot)
        if self._held:
            self._maybe_poll_progress()

    def _env_failed(self, slot: EnvSlot, exc: BaseException, relaunch: bool) -> None:
        """A call to an env worker (or the evaluator) failed: a bug stops the run; a lost
        peer starts a check that replaces the actor if its worker is gone."""
        if not _is_lost(exc):
            who = "the evaluator" if slot.index < 0 else f"env worker {slot.index}"
            raise ApexRuntimeError(f"{who} failed: {type(exc).__name__}: {str(exc).strip()[:200]}")
        if relaunch:
            self.rollouts_failed += 1
        if self.halting or slot.replacing:
            return
        slot.replacing = True
        self._tasks[asyncio.ensure_future(self._check_or_replace(slot))] = ("replace", slot)

    async def _check_or_replace(self, slot: EnvSlot) -> bool:
        """Raise if the learner's or a shard's worker is gone; re-create ``slot``'s actor
        if its worker is gone (True); else back off briefly (False)."""
        info = await self.client.scheduler.identity(n_workers=-1)
        alive = set(info.get("workers", {}))
        if self.learner_address not in alive:
            raise ApexRuntimeError(
                f"the learner's worker {self.learner_address} was lost; stopping the run"
            )
        for k, addr in enumerate(self.shard_addresses):
            if addr not in alive:
                raise ApexRuntimeError(
                    f"the worker {addr} of replay shard {k} was lost; stopping the run"
                )
        if slot.address in alive and slot.future.status == "finished":
            await asyncio.sleep(0.5)  # the actor lives; a peer was slow: retry soon
            return False
        await self.replace_env_worker(slot, info)
        return True

    def _after_replace(self, slot: EnvSlot, replaced: bool) -> None:
        slot.replacing = False
        if slot.index < 0:
            return
        if replaced:
            self.env_workers_replaced += 1
        if not self.halting:
            while slot.in_flight < self.cfg.workers.rollouts_in_flight:
                self._launch_rollout(slot)

    # ------------------------------------------------------------------ report
    async def _gather_small_stats(self) -> tuple[list[dict], list[dict]]:
        handles = [*self.shards, *(s.handle for s in self.slots)]
        got = await asyncio.gather(
            *(self._call(lambda h=h: h.stats(), self.timeout) for h in handles),
            return_exceptions=True,
        )
        n = len(self.shards)
        shards = [g if isinstance(g, dict) else {} for g in got[:n]]
        envs = [g if isinstance(g, dict) else {} for g in got[n:]]
        return shards, envs

    async def _gather_report(self) -> tuple[dict, list[dict], list[dict]]:
        try:
            learner = await call_with_timeout(self.learner.stats(), self.timeout)
        except Exception as exc:
            raise ApexRuntimeError(
                f"the learner is unreachable ({type(exc).__name__}: {exc}); its worker was "
                "probably lost, stopping the run"
            ) from None
        if learner.get("thread_error"):
            raise ApexRuntimeError(f"the learner thread failed: {learner['thread_error']}")
        shards, envs = await self._gather_small_stats()
        return learner, shards, envs

    def _extra(self) -> dict[str, float]:
        return {
            "faults/env_workers_replaced": float(self.env_workers_replaced),
            "faults/rollouts_failed": float(self.rollouts_failed),
        }

    def _result(
        self,
        window: IterationWindow,
        learner: dict,
        shards: list[dict],
        envs: list[dict],
        eval_result: Any,
    ) -> dict[str, float]:
        """One flat result dict from this window's stats (names: docs/metrics.md)."""
        return build_result(
            iteration=self.iteration,
            time_s=time.monotonic() - (self.t_start or 0.0),
            window=window,
            steps_total=self.steps_total,
            learner=learner,
            prev_learner=self.prev_learner,
            shards=shards,
            envs=envs,
            epsilons=[s.epsilon for s in self.slots],
            acting_versions=[s.version for s in self.slots],
            weight_syncs=self.weight_syncs,
            eval_result=eval_result,
            eval_time_s=self.eval_time_s,
            extra=self._extra(),
        )

    async def _emit(
        self, window: IterationWindow, learner: dict, shards: list[dict], envs: list[dict]
    ) -> None:
        result = self._result(window, learner, shards, envs, self.eval_result)
        self.eval_result = None
        self.prev_learner = learner
        self._trained = max(self._trained, int(learner["learner/steps_trained"]))
        try:
            msg = make_message(self.run_id, "driver", result)
            await self.client.scheduler.log_event(topic=TOPIC, msg=msg)
        except Exception:  # metrics must never stop training
            pass
        self.results.put(result)
