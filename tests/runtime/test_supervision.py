"""No background work dies silently: each supervised task, given a failure, restarts or
ends the run, as its row of ``docs/architecture.md`` ("Background work") says.

The plan runs over the real actor objects in this process (as
``test_plan_in_process.py``); a failpoint (``task:<name>``) makes the named task
raise once. A ``restart`` task is counted once in ``health/task_failures/<name>``
and its work goes on; an ``end`` task ends the run with one line naming it, after
a checkpoint. The tasks that need a cluster (the recovery, elasticity, the
evaluator's animation, the learner's tasks on a real worker) are in
``tests/e2e/test_chaos_matrix.py``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time

import pytest
from test_plan_in_process import build, small_config

from apex_dask.runtime.actors.failpoints import clear_failpoints, set_failpoint
from apex_dask.runtime.actors.supervision import END, RESTART, TASKS, TaskFailures, run_supervised
from apex_dask.runtime.errors import BackgroundTaskFailed
from apex_dask.runtime.orchestration.plan import ExecutionPlan


@pytest.fixture(autouse=True)
def no_failpoints_left():
    clear_failpoints()
    yield
    clear_failpoints()


# ------------------------------------------------------------ the supervisor
def test_a_restart_task_is_counted_logged_once_and_runs_again(caplog):
    failures = TaskFailures("test")
    runs = []

    async def flaky() -> None:
        runs.append(time.monotonic())
        if len(runs) <= 3:
            raise KeyError(f"run {len(runs)}")

    with caplog.at_level(logging.ERROR, logger="apex_dask.supervision"):
        asyncio.run(run_supervised("learner.priority_sender", flaky, failures, backoff_s=0.01))
    assert len(runs) == 4  # three failures, then it ran to its end
    assert failures.counts == {"learner.priority_sender": 3}
    assert failures.fatal is None
    logged = [r for r in caplog.records if "learner.priority_sender" in r.getMessage()]
    assert len(logged) == 1 and "KeyError: 'run 1'" in logged[0].getMessage()
    assert "restarting it" in logged[0].getMessage() and logged[0].exc_info is not None
    assert failures.metrics() == {"health/task_failures/learner.priority_sender": 3.0}


def test_an_end_task_stays_down_and_says_why():
    failures = TaskFailures("test")
    runs = []

    async def broken() -> None:
        runs.append(1)
        raise ValueError("bad state")

    asyncio.run(run_supervised("learner.thread", broken, failures))
    assert runs == [1]
    assert failures.fatal == "learner.thread: ValueError: bad state"


def test_a_cancelled_call_inside_is_a_failure_but_cancelling_the_task_is_not():
    failures = TaskFailures("test")

    async def scenario() -> None:
        inner = asyncio.get_running_loop().create_future()
        inner.cancel()
        calls = []

        async def awaits_a_cancelled_call() -> None:
            calls.append(1)
            if len(calls) == 1:
                await inner  # a CancelledError from inside: a failure, restarted
            await asyncio.sleep(10)

        task = asyncio.create_task(
            run_supervised("learner.prefetch", awaits_a_cancelled_call, failures, backoff_s=0.01)
        )
        while len(calls) < 2:
            await asyncio.sleep(0.01)
        task.cancel()  # the owner stops it: not a failure
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert failures.counts == {"learner.prefetch": 1}


def test_every_task_has_a_policy_and_a_row_in_the_architecture_docs():
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    for name, policy in TASKS.items():
        assert policy in (RESTART, END)
        assert f"`{name}`" in doc, f"{name} has no row in docs/architecture.md"


# ---------------------------------------------------- the plan, in this process
def plan_for(tmp_path, results: queue.Queue, **overrides) -> ExecutionPlan:
    cfg = small_config().override(overrides) if overrides else small_config()
    return ExecutionPlan(
        config=cfg,
        client=None,
        run_id="supervision",
        state=build(cfg),
        actors=None,
        results=results,
        min_replay_ratio=cfg.learner.min_replay_ratio,
        checkpoint_root=None if tmp_path is None else tmp_path / "checkpoints",
    )


async def results_until(plan, results, done, timeout_s: float, inject=()) -> list[dict]:
    """Run ``plan`` until ``done(results so far)``, switching the failpoints ``inject``
    (``(name, value)`` pairs) on after 2 results; halt; the results (the plan's error is
    raised)."""
    task = asyncio.ensure_future(plan.run())
    got: list[dict] = []
    deadline = time.monotonic() + timeout_s
    try:
        while not done(got):
            while not results.empty():
                got.append(results.get())
                if len(got) == 2:  # running: each task fails at its next turn
                    for name, value in inject:
                        set_failpoint(name, value)
            if task.done():
                task.result()
                break
            assert time.monotonic() < deadline, f"{len(got)} results in {timeout_s} s"
            await asyncio.sleep(0.05)
    finally:
        plan.state.halting = True
        await asyncio.wait_for(asyncio.shield(task), 60)
        for h in plan.state.handles():
            await h.close()
    return got


RESTART_HERE = [
    "learner.prefetch",
    "learner.priority_sender",
    "driver.evaluation",
    "driver.learner_health",
    "driver.checkpoints",
    "driver.pacing",
    "driver.invariants",
]


def test_each_restart_task_fails_once_is_counted_and_its_work_goes_on(tmp_path):
    assert {n for n in RESTART_HERE} <= {n for n, p in TASKS.items() if p == RESTART}
    results: queue.Queue = queue.Queue()
    plan = plan_for(tmp_path, results)

    def after_the_failures(got: list[dict]) -> bool:
        if not got or got[-1]["health/task_failures"] < len(RESTART_HERE):
            return False
        first = next(r for r in got if r["health/task_failures"] == len(RESTART_HERE))
        later = got[got.index(first) :]
        return len(later) >= 4 and sum("eval/return_mean" in r for r in later) >= 2

    inject = [(f"task:{name}", 1) for name in RESTART_HERE]
    got = asyncio.run(results_until(plan, results, after_the_failures, 180, inject))
    last, first = got[-1], next(r for r in got if r["health/task_failures"] == len(RESTART_HERE))
    for name in RESTART_HERE:
        assert last[f"health/task_failures/{name}"] == 1, name
    assert last["health/task_failures"] == len(RESTART_HERE)
    # the work of each went on after its failure
    for k in range(2):
        for name in ("batches_sampled", "priority_updates_applied"):
            assert last[f"replay/{k}/{name}"] > first[f"replay/{k}/{name}"], (k, name)
    assert last["timesteps_total"] > first["timesteps_total"]  # the pacer lets env workers go
    assert last["learner/steps_trained"] > first["learner/steps_trained"]
    assert "health/invariant_violations" in last  # the checker runs again
    assert plan.checkpoints.latest() is not None  # checkpoints go on
    assert last["health/invariant_violations"] == 0


@pytest.mark.parametrize("name", ["driver.report", "driver.calls", "learner.thread"])
def test_an_end_task_that_fails_ends_the_run_with_one_line_and_a_checkpoint(tmp_path, name):
    assert TASKS[name] == END
    results: queue.Queue = queue.Queue()
    plan = plan_for(tmp_path, results)

    with pytest.raises(BackgroundTaskFailed) as err:
        asyncio.run(results_until(plan, results, lambda got: False, 120, [(f"task:{name}", 1)]))
    line = str(err.value)
    assert err.value.task == name
    assert name in line and "InjectedFault" in line and "\n" not in line
    assert "stopping the run" in line and "checkpoint" in line and "written" in line
    ckpt = plan.checkpoints.latest()
    assert ckpt is not None and str(ckpt) in line
