"""The seed's operations that move data: store, and replay + update.

::

    store = StoreRollouts(state, tasks, cfg.workers, on_failure=faults.env_failed, hold=pacer.hold)
    store.start(slot)          # per env worker: rollouts_in_flight calls going
    replay_and_update = ReplayAndUpdate(state, timeout_s)
    await replay_and_update.start() ... await replay_and_update.stop(timeout_s)

The store operation is driven by its calls' handlers (a finished rollout
starts the next one), not by the loop's ticks; replay and update live in the
learner actor (prefetcher, learner thread, priority sender).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from apex_dask.algo.rollout.exploration import lowest_epsilon_workers
from apex_dask.config.tree import EnvWorkersConfig
from apex_dask.experiment.messages import RolloutSummary
from apex_dask.experiment.results import IterationWindow
from apex_dask.runtime.actors.calls import call_with_timeout
from apex_dask.runtime.errors import ApexRuntimeError, describe
from apex_dask.runtime.orchestration.state import EnvSlot, RunState
from apex_dask.runtime.orchestration.tasks import TaskSet, task_error

__all__ = ["ReplayAndUpdate", "StoreRollouts"]

EnvFailure = Callable[..., None]
"""``on_failure(slot, exc, relaunch, restart=None)`` (:meth:`.faults.FaultHandler.env_failed`)."""
Hold = Callable[[EnvSlot, Callable[[EnvSlot], None]], bool]
"""``hold(slot, relaunch)`` (:meth:`.pacing.ReplayRatioPacer.hold`): True if ``slot``'s next
rollout waits; ``relaunch(slot)`` once it may go."""


class StoreRollouts:
    """store: rollouts env worker -> random shard, then the weight sync.

    ``ParallelRollouts(num_async=rollouts_in_flight)`` -> ``StoreToReplayBuffer``
    -> ``UpdateWorkerWeights(max_weight_sync_delay)``: each env worker keeps
    ``rollouts_in_flight`` calls going, each storing its rollouts in uniformly
    random live shards; a worker that produced ``max_weight_sync_delay`` steps
    since its last sync pulls newer weights (one blob per learner version).
    ``on_failure(slot, exc, relaunch, restart)`` gets failed calls (with :meth:`start`,
    which sets a replaced worker going again); ``hold(slot, relaunch)`` (the pacer's;
    None: never) may keep a worker's next rollout back, handing it to
    :meth:`launch` later.
    """

    def __init__(
        self,
        state: RunState,
        tasks: TaskSet,
        workers: EnvWorkersConfig,
        on_failure: EnvFailure,
        hold: Hold | None = None,
    ) -> None:
        self.state, self.tasks, self.w = state, tasks, workers
        self.on_failure = on_failure
        self.hold: Hold = hold or (lambda slot, relaunch: False)
        self.window = IterationWindow()  # this iteration's steps and episodes
        self.lowest: set[int] = set()
        self.envs_changed()

    def envs_changed(self) -> None:
        """Env workers joined or are leaving: episode stats come from the lowest-epsilon
        third of those that stay (the highest ladder slots in use)."""
        idx = sorted(s.index for s in self.state.slots if not s.retiring)
        self.lowest = {idx[j] for j in lowest_epsilon_workers(len(idx))} if idx else set()

    def start(self, slot: EnvSlot) -> None:
        """Keep ``rollouts_in_flight`` rollouts going; a worker without weights syncs first
        (so no rollout is acted with a random net, as in the in-process runner)."""
        if slot.version < 0:
            self._sync(slot, then_launch=True)
        else:
            self.fill(slot)

    def fill(self, slot: EnvSlot) -> None:
        while not slot.retiring and slot.in_flight < self.w.rollouts_in_flight:
            self.launch(slot)

    def launch(self, slot: EnvSlot) -> None:
        """One call of ``rollouts_per_call`` rollouts, each to a uniformly random shard;
        none while ``rollouts_in_flight`` calls are out. Two paths can ask for the same
        place: the pacer's release of a held rollout, and a restart (after a failed
        weights sync) that fills the slot while that rollout was held. None while the
        fault handler replaces the worker: its restart syncs the new actor, then fills it
        (a held rollout let go meanwhile would be a call to the lost actor)."""
        if slot.retiring or slot.replacing:  # leaving (elastic runs), or being replaced
            return
        if slot.in_flight >= self.w.rollouts_in_flight:
            return
        n = self.w.rollouts_per_call
        shards = self.state.live_shards()
        ks = [shards[int(i)] for i in self.state.rng.integers(len(shards), size=n)]
        arg = ks[0] if n == 1 else ks
        slot.in_flight += 1
        self.state.rollouts.launched(ks)
        self.tasks.spawn(lambda: slot.handle.sample_into(arg), lambda t: self._stored(slot, t, ks))

    def take_window(self) -> IterationWindow:
        """This iteration's window; a new one starts."""
        window, self.window = self.window, IterationWindow()
        return window

    def _stored(self, slot: EnvSlot, task: asyncio.Future, ks: list[int]) -> None:
        slot.in_flight -= 1
        exc = task_error(task)
        if exc is not None:
            self.state.rollouts.failed(ks)
            self.on_failure(slot, exc, True, self.start)
            return
        s: RolloutSummary = task.result()
        self.state.rollouts.returned(ks, s.rollouts)
        c = self.state.counters
        c.rollouts_returned += s.rollouts
        c.steps_total += s.steps
        c.faults.env_errors += s.env_errors
        for line in s.warnings:  # the CLI routes py.warnings to the run's log
            logging.getLogger("py.warnings").warning("env worker %d: %s", slot.index, line)
        self.window.steps += s.steps
        slot.steps_since_sync += s.steps
        slot.version = s.weights_version
        if slot.joined_at is not None and s.rollouts:  # an elastic join's first rollout
            self.state.change(
                f"env worker {slot.index} stored its first rollout "
                f"{time.time() - slot.joined_at:.1f} s after its Dask worker joined"
            )
            slot.joined_at = None
        if slot.index in self.lowest:
            self.window.episode_returns += s.episode_returns
            self.window.episode_lengths += s.episode_lengths
        if self.state.halting or slot.retiring:
            return
        if not self.hold(slot, self.launch):
            self.launch(slot)
        self._maybe_sync(slot)

    def _maybe_sync(self, slot: EnvSlot) -> None:
        if slot.syncing or slot.replacing or slot.steps_since_sync < self.w.max_weight_sync_delay:
            return
        if time.monotonic() >= slot.retry_sync_at:
            self._sync(slot, then_launch=False)

    def _sync(self, slot: EnvSlot, then_launch: bool) -> None:
        slot.syncing = True
        self.tasks.spawn(
            lambda: slot.handle.sync_weights(), lambda t: self._synced(slot, t, then_launch)
        )

    def _synced(self, slot: EnvSlot, task: asyncio.Future, then_launch: bool) -> None:
        slot.syncing = False
        exc = task_error(task)
        if exc is not None:
            self.on_failure(slot, exc, False, self.start)
            return
        version = task.result()
        if version is None:  # the learner has nothing newer yet
            slot.retry_sync_at = time.monotonic() + 0.1
        else:
            self.state.counters.weight_syncs += 1
            slot.steps_since_sync = 0
            slot.version = int(version)
        if then_launch and not self.state.halting:
            self.fill(slot)


class ReplayAndUpdate:
    """replay + update: ``Replay(num_async=4)`` -> ``Enqueue`` -> ``LearnerThread`` ->
    ``Dequeue`` -> ``update_priorities``, all inside the learner actor; this starts
    and stops it."""

    def __init__(self, state: RunState, timeout_s: float) -> None:
        self.state, self.timeout = state, timeout_s

    async def start(self) -> None:
        try:
            await call_with_timeout(self.state.learner.start(), self.timeout)
        except Exception as exc:
            raise ApexRuntimeError(
                f"cannot start the learner on {self.state.learner_address}: {describe(exc)}"
            ) from None

    async def stop(self, timeout_s: float) -> dict[str, Any]:
        """Drain the learner (final stats: every ``flow/*`` counter agrees)."""
        inside = max(0.1, 0.75 * timeout_s)  # the learner answers before the call times out
        try:
            return await call_with_timeout(self.state.learner.stop(inside), timeout_s)
        except Exception as exc:
            raise ApexRuntimeError(
                f"cannot stop the learner ({describe(exc)}); was its worker lost?"
            ) from None
