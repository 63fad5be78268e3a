"""The execution plan over the real actor objects in this process, without Dask.

The shards, the learner and the env workers are the classes a Dask worker
hosts; here their async methods run on one ``asyncio.run`` loop (the
learner's thread and the env workers' env threads run as they do on a
worker). So the plan's operations and jobs (store, report, evaluation,
health, pacing, checkpoints) are exercised in seconds. The same run on a
cluster: ``test_driver.py``.
"""

from __future__ import annotations

import asyncio
import queue
import time
from dataclasses import dataclass
from typing import Any

import pytest

from apex_dask.algo.envs.probe import probe_spaces
from apex_dask.algo.rollout.exploration import apex_epsilons
from apex_dask.config import ApexConfig
from apex_dask.experiment.builder import (
    agent_spec,
    env_factory,
    shard_actor_kwargs,
    worker_spec,
)
from apex_dask.experiment.checkpoints.store import read_manifest
from apex_dask.runtime.actors import EnvWorkerActor, LearnerActor, ReplayShardActor
from apex_dask.runtime.orchestration.operations import StoreRollouts
from apex_dask.runtime.orchestration.plan import ExecutionPlan
from apex_dask.runtime.orchestration.state import EnvSlot, RunState
from apex_dask.runtime.orchestration.tasks import TaskSet


def small_config() -> ApexConfig:
    return ApexConfig.preset("cartpole").override(
        {
            "replay.learning_starts": 200,
            "dqn.hiddens": (32,),
            "report.min_iter_time_s": 0.2,
            "report.timesteps_per_iteration": 200,
            "eval.interval_s": 0.5,
            "eval.episodes": 2,
            "eval.max_episode_steps": 50,
            "checkpoint.interval_s": 0.5,
        }
    )


def build(cfg: ApexConfig) -> RunState:
    factory = env_factory(cfg)
    spaces = probe_spaces(factory)
    n_shards, n_env = cfg.replay.num_shards, cfg.workers.num_workers
    shards = [ReplayShardActor(k, **shard_actor_kwargs(cfg, k)) for k in range(n_shards)]
    lr = cfg.learner
    learner = LearnerActor(
        *spaces,
        shards,
        agent=agent_spec(cfg),
        batch_size=lr.batch_size,
        inqueue_size=lr.inqueue_size,
        prefetch_per_shard=lr.prefetch_per_shard,
        max_replay_ratio=lr.max_replay_ratio,
        audit_priorities=cfg.replay.audit_priorities,
    )
    eps = apex_epsilons(n_env, cfg.workers.epsilon_base, cfg.workers.epsilon_alpha)

    def worker(i: int, epsilon: float) -> EnvWorkerActor:
        spec = worker_spec(cfg)
        return EnvWorkerActor(i, factory, shards, learner, spec, exploration=epsilon, seed=i + 1)

    slots = [EnvSlot(i, None, worker(i, e), "in-process", float(e)) for i, e in enumerate(eps)]
    evaluator = EnvSlot(-1, None, worker(-1, 0.0), "in-process", 0.0)
    return RunState(
        learner=learner,
        learner_address="in-process",
        shards=shards,
        slots=slots,
        evaluator=evaluator,
        seed=cfg.seed,
    )


async def run_until(plan: ExecutionPlan, results: queue.Queue, n: int, timeout_s: float) -> list:
    """Run ``plan`` until ``n`` results arrived; halt it; the results."""
    task = asyncio.ensure_future(plan.run())
    deadline = time.monotonic() + timeout_s
    while results.qsize() < n:
        if task.done():
            task.result()  # the plan's error, if any
        assert time.monotonic() < deadline, f"{results.qsize()} of {n} results in {timeout_s} s"
        await asyncio.sleep(0.05)
    plan.state.halting = True
    await asyncio.wait_for(task, 60)
    return [results.get() for _ in range(results.qsize())]


def test_the_plan_runs_over_in_process_actors_and_every_hop_agrees_after_the_halt(tmp_path):
    cfg = small_config()

    async def scenario():
        state = build(cfg)
        results: queue.Queue = queue.Queue()
        plan = ExecutionPlan(
            config=cfg,
            client=None,
            run_id="in-process",
            state=state,
            actors=None,
            results=results,
            min_replay_ratio=cfg.learner.min_replay_ratio,
            checkpoint_root=tmp_path / "checkpoints",
        )
        got = await run_until(plan, results, 3, timeout_s=120)
        for h in state.handles():
            await h.close()
        return plan, state, got

    plan, state, results = asyncio.run(scenario())
    assert [r["iteration"] for r in results] == [1.0, 2.0, 3.0][: len(results)]
    assert all(r["timesteps_total"] >= cfg.report.timesteps_per_iteration for r in results)
    assert any("eval/return_mean" in r for r in results), "no evaluation finished"
    final = plan.final
    assert final is not None and final["learner/steps_trained"] > 0
    # after the halt nothing is in transit: every hop's two ends agree
    assert final["flow/rollouts_sent"] == final["flow/rollouts_stored"] > 0
    assert final["flow/batches_sampled"] == final["flow/batches_received"]
    assert (
        final["flow/batches_received"]
        == final["flow/batches_trained"] + final["flow/batches_in_queue"]
    )
    assert final["flow/priority_updates_sent"] == final["flow/priority_updates_applied"]
    assert final["flow/batches_lost"] == final["flow/rollouts_lost"] == 0
    assert all(final[f"faults/{k}"] == 0 for k in ("env_workers_replaced", "rollouts_failed"))
    # the periodic checkpoint job wrote complete checkpoints of every part
    ckpt = plan.checkpoints.latest()
    assert ckpt is not None
    assert set(read_manifest(ckpt)["parts"]) == {"learner", "driver", "shard_0", "shard_1"}
    assert state.counters.steps_total == final["timesteps_total"]
    # no supervised task failed, no law of the counters was broken on the way
    assert final["health/task_failures"] == 0
    assert all(r["health/invariant_violations"] == 0 for r in results)


def test_run_state_snapshot_restores_counters_rng_and_history():
    cfg = small_config()
    a = RunState(learner=None, learner_address="", shards=[], slots=[], evaluator=None, seed=3)
    a.counters.steps_total, a.counters.iteration, a.counters.weight_syncs = 1234, 7, 5
    a.counters.faults.shards_restored = 2
    a.counters.retired.shards.rollouts_stored = 9
    a.eval_history.append({"timesteps_total": 1000, "return_mean": 20.0, "weights_version": 4})
    a.rng.integers(10, size=5)
    snap = a.snapshot()
    b = RunState(
        learner=None, learner_address="", shards=[], slots=[], evaluator=None, seed=cfg.seed
    )
    b.restore(snap)
    assert b.snapshot()["rng"] == snap["rng"]
    assert (b.counters.steps_total, b.counters.iteration, b.counters.weight_syncs) == (1234, 7, 5)
    assert b.counters.faults.shards_restored == 2
    assert b.counters.retired.metrics() == {"flow/rollouts_stored": 9.0}
    assert b.eval_history == a.eval_history
    assert b.rng.integers(1 << 30) == a.rng.integers(1 << 30)


@pytest.mark.parametrize("missing", [[], [1]])
def test_rollouts_go_only_to_live_shards_while_one_is_rebuilt(missing):
    s = RunState(
        learner=None, learner_address="", shards=["s0", "s1", "s2"], slots=[], evaluator=None
    )
    for k in missing:
        s.shard_lost(k)
    assert s.live_shards() == [k for k in range(3) if k not in missing]
    s.replace_shard(1, "new")
    assert s.live_shards() == [0, 1, 2] and s.shards[1] == "new"


@dataclass
class Held:
    """Env worker 0 of a fresh state whose store's pacer held its first
    ``rollouts_in_flight`` rollouts as they returned (their relaunches in ``held``: the
    learner is behind); later ones go. Any failed call fails the test."""

    state: Any
    tasks: TaskSet
    store: StoreRollouts
    slot: Any
    held: list
    peak: int  # the most rollout calls on the worker while they were held
    deadline: float

    async def drain(self) -> None:
        """No more launches: wait for what is in flight, then close the actors."""
        self.state.halting = True
        while self.slot.in_flight:
            assert time.monotonic() < self.deadline + 60, "rollouts still in flight"
            await self.tasks.step(0.1)
        for h in self.state.handles():
            await h.close()


async def hold_first_rollouts(cfg) -> Held:
    bound = cfg.workers.rollouts_in_flight
    state, tasks, held = build(cfg), TaskSet(timeout_s=60), []

    def hold(slot, relaunch):
        if len(held) < bound:
            held.append(relaunch)
            return True
        return False

    def failed(slot, exc, relaunch, restart=None):
        raise AssertionError(f"a call failed: {exc!r}")

    store = StoreRollouts(state, tasks, cfg.workers, on_failure=failed, hold=hold)
    slot, peak = state.slots[0], 0
    store.start(slot)  # syncs the weights first, then fills the worker
    deadline = time.monotonic() + 60
    while len(held) < bound:
        assert time.monotonic() < deadline, f"{len(held)} rollouts held after 60 s"
        await tasks.step(0.1)
        peak = max(peak, slot.in_flight)
    return Held(state, tasks, store, slot, held, peak, deadline)


def test_held_rollouts_released_after_a_restart_keep_the_worker_under_its_bound():
    """The chaos matrix's row 3 once saw 4 rollout calls on one env worker (bound 2): both
    of its rollouts were held by the pacer, a failed weights sync restarted the worker
    (which filled it), then the pacer released the two held rollouts on top."""
    cfg = small_config()
    bound = cfg.workers.rollouts_in_flight

    async def scenario():
        h = await hold_first_rollouts(cfg)
        slot = h.slot
        assert slot.in_flight == 0
        h.store.start(slot)  # what the fault handler calls after a failed weights sync
        for relaunch in h.held:  # then the learner catches up: the pacer lets them go
            relaunch(slot)
        peak = max(h.peak, slot.in_flight)
        in_flight_after_release = slot.in_flight
        await h.drain()
        return h.state, peak, in_flight_after_release

    state, peak, after = asyncio.run(scenario())
    assert after == bound
    assert peak == bound
    # every call went out and came back: no shard is owed a rollout
    assert all(x.in_flight == 0 for x in state.rollouts.shards)
    per_call = cfg.workers.rollouts_per_call
    assert state.counters.rollouts_returned == sum(x.acked for x in state.rollouts.shards)
    assert state.counters.rollouts_returned == (bound + bound) * per_call


def test_held_rollouts_released_while_the_worker_is_replaced_are_not_sent_to_it():
    """A rollout the pacer held and lets go while the fault handler replaces its env
    worker is not launched (it would be a call to the lost actor, one more failed
    rollout, or act on the new actor before its weights sync); the restart fills it."""
    cfg = small_config()
    bound = cfg.workers.rollouts_in_flight

    async def scenario():
        h = await hold_first_rollouts(cfg)
        slot = h.slot
        launched = h.state.counters.rollouts_returned
        slot.replacing = True  # what the fault handler sets while it checks or replaces
        for relaunch in h.held:
            relaunch(slot)
        during = slot.in_flight
        slot.replacing = False
        h.store.start(slot)  # the fault handler's restart
        after = slot.in_flight
        await h.drain()
        return h.state, launched, during, after

    state, launched, during, after = asyncio.run(scenario())
    assert during == 0
    assert after == bound
    per_call = cfg.workers.rollouts_per_call
    assert launched == bound * per_call
    assert state.counters.rollouts_returned == 2 * bound * per_call
    assert all(x.in_flight == 0 for x in state.rollouts.shards)
