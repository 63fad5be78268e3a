"""The chaos matrix: each fault injected into a real cluster run, and the run stays right.

A `dask scheduler` and 3 nanny-managed `dask worker` processes (one cluster for
the module; a nanny restarts a killed worker process at a new address). Each
row trains CartPole with every law of the counters strict
(``report.strict_invariants``: a violated law ends the run and fails the row),
the priority audit on and the default call timeout (60 s), injects its fault
once a checkpoint exists, and checks:

- within ``BOUND_S`` (30 s) of the fault, every shard's ``batches_sampled`` and
  ``priority_updates_applied`` rose again (past their values at the first result
  that shows the fault handled);
- the run trains on to its budget (``AFTER_S``, 20 s past the fault, longer until the
  recovery is seen twice, at most ``BOUND_S`` + 5 s) and halts;
  no supervised task failed, no law was broken, every hop's counters agree.

=====  ================================================================  =====================
row    fault                                                             where
=====  ================================================================  =====================
1      kill -9 the process holding a shard (not the learner's): it is    this module
       rebuilt on the learner's worker
2      kill -9 the learner's process; greedy evaluation reports again    this module
       within ``EVAL_BOUND_S`` of the rebuilt learner
3      kill -9 the learner's and a shard's processes together            this module
4      kill -9 an env worker's process                                   this module
5      SIGKILL the driver (`apex-dask-submit`) while it writes a         this module
       checkpoint, then ``--resume``
6      ``--resume`` twice from the same checkpoint (and a shard rebuilt  this module
       from it once more)
7      retire a shard's worker (elastic) while it is sampled             this module
=====  ================================================================  =====================

The matrix can fail: the code before these checks existed failed rows 1 and 6
(row 1: the rebuilt shard was not sampled for a minute; row 6: updates computed
before the rebuild landed on new items), and each law trips on an injected bug
(``tests/runtime/test_laws.py``; here, on a worker process: a dropped priority
update and a weights version rolled back).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from chaos import (
    BIN,
    ChaosCluster,
    config,
    healthy_and_balanced,
    on,
    run_row,
    shard_off_the_learner,
    shards_sampled_and_updated_again,
)

from apex_dask.runtime.actors.failpoints import clear_failpoints, set_failpoint
from apex_dask.runtime.errors import BackgroundTaskFailed, InvariantViolated
from apex_dask.runtime.orchestration.driver import ApexDriver

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("chaos-matrix")]

EVAL_BOUND_S = 20.0
"""Seconds from the result that shows a rebuilt learner to the next greedy evaluation."""


@pytest.fixture(scope="module")
def cc(tmp_path_factory):
    with ChaosCluster(tmp_path_factory.mktemp("chaos"), workers=3) as cluster:
        yield cluster


@pytest.fixture
def all_workers(cc):
    """Every row starts with all 3 workers (a killed one is restarted by its nanny)."""
    cc.wait_for_workers()
    yield cc
    cc.client.run(clear_failpoints)


def counts(name: str, n: int):
    return lambda r: r[f"faults/{name}"] >= n


# --------------------------------------------------------------------------- rows
def test_row1_a_shard_killed_beside_a_living_learner_is_sampled_and_updated_again(
    all_workers, tmp_path
):
    cc = all_workers
    handled = counts("shards_restored", 1)

    def kill_a_shard(driver):
        p = driver.placement
        k, target = shard_off_the_learner(p)
        cc.kill(target)
        return {
            "shard": k,
            "address": target,
            "learner": p["learner"]["address"],
            "on": on(p, target),
        }

    with ApexDriver(config(), cc.client, checkpoint_dir=tmp_path / "ckpt") as driver:
        row = run_row(driver, kill_a_shard, handled)
    took = shards_sampled_and_updated_again(row, 2, handled)
    k = row.fault["shard"]
    assert row.final["faults/shards_restored"] == 1 + row.fault["on"]["learner"]
    # rebuilt on the learner's worker: the learner samples it as a local object
    assert row.placement["shards"][k]["address"] == row.fault["learner"]
    healthy_and_balanced(row.final)
    print(f"row 1: every shard sampled and updated again {took:.1f} s after the kill")


def test_row2_after_the_learner_is_killed_evaluation_reports_within_an_interval(
    all_workers, tmp_path
):
    cc = all_workers
    handled = counts("learner_restored", 1)

    def kill_the_learner(driver):
        target = driver.placement["learner"]["address"]
        cc.kill(target)
        return {"address": target}

    with ApexDriver(config(), cc.client, checkpoint_dir=tmp_path / "ckpt") as driver:
        row = run_row(driver, kill_the_learner, handled)
    took = shards_sampled_and_updated_again(row, 2, handled)
    back = next(t for t, r in row.after(row.fault_at) if handled(r))
    evals = [t for t, r in row.after(back) if not math.isnan(r.get("eval/return_mean", math.nan))]
    assert evals, "no greedy evaluation after the learner was rebuilt"
    assert evals[0] - back <= EVAL_BOUND_S, f"evaluation silent {evals[0] - back:.0f} s"
    healthy_and_balanced(row.final)
    print(
        f"row 2: sampled and updated again after {took:.1f} s, evaluation after "
        f"{evals[0] - back:.1f} s"
    )


def test_row3_the_learner_and_a_shard_killed_together(all_workers, tmp_path):
    cc = all_workers

    def kill_both(driver):
        p = driver.placement
        learner = p["learner"]["address"]
        shard = next(w["address"] for w in p["shards"] if w["address"] != learner)
        cc.kill(learner, shard)
        return {"shards": on(p, learner)["shards"] + on(p, shard)["shards"]}

    def handled(r):
        return r["faults/learner_restored"] >= 1 and r["faults/shards_restored"] >= 1

    with ApexDriver(config(), cc.client, checkpoint_dir=tmp_path / "ckpt") as driver:
        row = run_row(driver, kill_both, handled)
    shards_sampled_and_updated_again(row, 2, handled)
    assert row.final["faults/shards_restored"] == row.fault["shards"]
    assert row.final["faults/learner_restored"] == 1
    healthy_and_balanced(row.final)


def test_row4_an_env_workers_process_killed(all_workers, tmp_path):
    cc = all_workers
    handled = counts("env_workers_replaced", 1)
    cfg = config(**{"replay.placement": "learner_process"})  # env workers alone elsewhere

    def kill_an_env_worker(driver):
        p = driver.placement
        target = next(
            w["address"]
            for w in p["env_workers"]
            if w and on(p, w["address"])["shards"] == 0 and on(p, w["address"])["learner"] == 0
        )
        cc.kill(target)
        return {"env_workers": on(p, target)["env_workers"]}

    with ApexDriver(cfg, cc.client, checkpoint_dir=tmp_path / "ckpt") as driver:
        row = run_row(driver, kill_an_env_worker, handled)
    shards_sampled_and_updated_again(row, 2, handled)
    assert row.final["faults/env_workers_replaced"] == row.fault["env_workers"]
    assert row.final["faults/shards_restored"] == row.final["faults/learner_restored"] == 0
    healthy_and_balanced(row.final)


# ------------------------------------------------------------------ the CLI rows
def submit(cc, out: Path, *args: str, resume: bool = False) -> subprocess.Popen:
    """``apex-dask-submit`` on the module's cluster, writing into ``out``."""
    where = ["--resume", str(out)] if resume else ["--out", str(out)]
    cmd = [str(BIN / "apex-dask-submit"), "--scheduler-file", str(cc.scheduler_file), *where]
    log = out.parent / f"{out.name}-{time.monotonic_ns()}.log"
    return subprocess.Popen(
        [*cmd, "--quiet", *args], stdout=log.open("w"), stderr=subprocess.STDOUT
    )


def sets(**keys) -> list[str]:
    return [x for k, v in keys.items() for x in ("--set", f"{k.replace('__', '.')}={v}")]


ROW_KEYS = sets(
    replay__num_shards=2,
    replay__placement="spread",
    replay__capacity=4000,  # the ring is full before the first checkpoint
    replay__audit_priorities="true",
    workers__num_workers=2,
    eval__episodes=3,
    report__strict_invariants="true",
    seed=13,
)


def rows_of(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def finished(proc: subprocess.Popen, timeout_s: float) -> int:
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"apex-dask-submit still running after {timeout_s} s") from None


def no_actor_left(cc, timeout_s: float = 60.0) -> None:
    """Every worker holds no actor and runs no learner thread (a driver that died took
    its run with it: nothing keeps training on the workers)."""
    import threading

    def left(dask_worker) -> int:
        names = [t.name for t in threading.enumerate()]
        return len(dask_worker.state.actors) + names.count("apex-learner")

    deadline = time.monotonic() + timeout_s
    while any(cc.client.run(left).values()):
        assert time.monotonic() < deadline, cc.client.run(left)
        time.sleep(0.5)


def every_shard_trained_on_after(rows: list[dict], start: int) -> None:
    """Each shard's sampled and applied counters rose over the rows from ``start`` on."""
    first, last = rows[start], rows[-1]
    for k in range(2):
        for n in ("batches_sampled", "priority_updates_applied"):
            assert last[f"replay/{k}/{n}"] > first[f"replay/{k}/{n}"], (k, n, first, last)


def test_row5_the_driver_killed_while_it_writes_a_checkpoint_then_resume(all_workers, tmp_path):
    cc, out = all_workers, tmp_path / "run"
    run = submit(cc, out, *ROW_KEYS, *sets(checkpoint__interval_s=3), "--stop-time", "300")
    ckpts, deadline = out / "checkpoints", time.monotonic() + 180
    while True:  # the second checkpoint's write: its hidden folder appears, then the kill
        assert run.poll() is None and time.monotonic() < deadline, "no checkpoint write seen"
        names = os.listdir(ckpts) if ckpts.exists() else []
        if any(n.startswith(".") and ".tmp-" in n for n in names) and any(
            n.startswith("ckpt-") for n in names
        ):
            run.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    run.wait()
    assert any(".tmp-" in n for n in os.listdir(ckpts)), "the write finished before the kill"
    no_actor_left(cc)  # the dead driver's actors went with it
    before = len(rows_of(out))
    resumed = submit(cc, out, "--stop-time", "30", resume=True)
    assert finished(resumed, 240) == 0  # a violated law would end it with exit 3
    assert not any(".tmp-" in n for n in os.listdir(ckpts))  # the leftover was removed
    rows = rows_of(out)
    assert len(rows) > before + 3
    every_shard_trained_on_after(rows, before)
    final = json.loads((out / "final.json").read_text())
    assert final["health/task_failures"] == final["health/invariant_violations"] == 0
    assert all(final.get(f"replay/{k}/audit_mismatches", 0) == 0 for k in range(2))


def test_row6_resume_twice_from_one_checkpoint_and_rebuild_a_shard_from_it(all_workers, tmp_path):
    cc, out = all_workers, tmp_path / "run"
    first = submit(cc, out, *ROW_KEYS, *sets(checkpoint__interval_s=4), "--stop-time", "15")
    assert finished(first, 240) == 0
    newest = sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("ckpt-"))
    assert newest
    # a resume killed before it writes a checkpoint (none periodic, no end one): the next
    # resume restores the same checkpoint again
    before = len(rows_of(out))
    again = submit(cc, out, "--stop-time", "120", *sets(checkpoint__interval_s=0), resume=True)
    deadline = time.monotonic() + 180
    while len(rows_of(out)) < before + 5:
        assert again.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    again.send_signal(signal.SIGKILL)
    again.wait()
    same = sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("ckpt-"))
    assert same == newest
    no_actor_left(cc)
    third = submit(cc, out, "--stop-time", "45", *sets(checkpoint__interval_s=0), resume=True)
    deadline, started, base = time.monotonic() + 180, time.time(), len(rows_of(out))
    while True:  # once it trains, kill a shard's process: rebuilt from that checkpoint too
        assert third.poll() is None and time.monotonic() < deadline
        placement = out / "placement.json"
        rows = rows_of(out)
        if len(rows) > base + 3 and placement.stat().st_mtime > started:
            p = json.loads(placement.read_text())
            learner = p["learner"]["address"]
            target = next(w["address"] for w in p["shards"] if w["address"] != learner)
            if target in cc.addresses():
                break
        time.sleep(0.5)
    at = len(rows)
    cc.kill(target)
    assert finished(third, 240) == 0  # strict: a violated law (the audit's too) ends it, 3
    rows = rows_of(out)
    rebuilt = next(i for i, r in enumerate(rows) if i >= at and r["faults/shards_restored"] >= 1)
    assert len(rows) > rebuilt + 3
    every_shard_trained_on_after(rows, rebuilt)
    final = json.loads((out / "final.json").read_text())
    assert final["faults/shards_restored"] == 1
    assert final["health/task_failures"] == final["health/invariant_violations"] == 0
    assert all(final.get(f"replay/{k}/audit_mismatches", 0) == 0 for k in range(2))
    assert final["flow/priority_updates_stale"] >= 0


def test_row7_a_shards_worker_retired_while_it_is_sampled(all_workers, tmp_path):
    cc = all_workers
    cfg = config(**{"topology.elastic": True, "workers.per_process": 1})
    handled = counts("shards_restored", 0)

    def retire_a_shard(driver):
        k, target = shard_off_the_learner(driver.placement)
        # returns once the run moved its actors off (the shard, while it is sampled)
        cc.client.retire_workers(workers=[target], close_workers=True)
        return {"shard": k, "address": target}

    def moved(r):
        return r["elastic/shards_moved"] >= 1

    with ApexDriver(cfg, cc.client, checkpoint_dir=tmp_path / "ckpt") as driver:
        row = run_row(driver, retire_a_shard, moved)
    assert handled(row.final)
    shards_sampled_and_updated_again(row, 2, moved)
    assert row.final["elastic/shards_moved"] >= 1
    assert row.final["faults/shards_restored"] == row.final["faults/learner_restored"] == 0
    assert row.placement["shards"][row.fault["shard"]]["address"] != row.fault["address"]
    healthy_and_balanced(row.final)
    cc.add_worker("w-replacement")  # the cluster has its 3 workers again


# --------------------------------------------------------- the matrix can fail
def test_a_dropped_priority_update_on_the_learners_worker_ends_a_strict_run(all_workers, tmp_path):
    cc = all_workers
    with ApexDriver(config(), cc.client) as driver:
        learner = driver.placement["learner"]["address"]
        cc.client.run(set_failpoint, "drop_priority_update_every", 10, workers=[learner])
        with pytest.raises(InvariantViolated) as err:
            for _ in driver.iterate():
                pass
    assert err.value.law == "priority_updates" and "missing" in str(err.value)


def test_a_weights_version_rolled_back_on_an_env_worker_ends_a_strict_run(all_workers, tmp_path):
    cc = all_workers
    with ApexDriver(config(), cc.client) as driver:
        p = driver.placement
        where = [w["address"] for w in p["env_workers"] if w]
        t0 = time.monotonic()
        with pytest.raises(InvariantViolated) as err:
            for r in driver.iterate():
                if time.monotonic() - t0 > 5 and r["learner/version"] > 100:
                    cc.client.run(set_failpoint, "weights_version_back", 50, workers=where)
    assert err.value.law == "versions" and "went back" in str(err.value)


# ------------------------------------------- supervised tasks on a real cluster
WORKER_RESTART_TASKS = [
    "learner.prefetch",
    "learner.priority_sender",
    "learner.orphan_watch",
    "evaluator.animation",
    "env.orphan_watch",
]


def test_tasks_in_worker_processes_fail_once_are_counted_and_restarted(all_workers, tmp_path):
    cc = all_workers
    cfg = config(**{"topology.elastic": True, "workers.per_process": 1})
    with ApexDriver(cfg, cc.client, checkpoint_dir=tmp_path / "ckpt") as driver:
        it, t0 = driver.iterate(), time.monotonic()
        for _ in range(3):
            next(it)
        for name in WORKER_RESTART_TASKS:  # in every worker process: each fails once there
            cc.client.run(set_failpoint, f"task:{name}")
        first = None
        for result in it:
            assert time.monotonic() - t0 < 180, {
                k: v for k, v in result.items() if k.startswith("health/task_failures/") and v
            }
            counted = all(result[f"health/task_failures/{n}"] >= 1 for n in WORKER_RESTART_TASKS)
            if counted and first is None:
                first = result
            elif first is not None and result["iteration"] >= first["iteration"] + 4:
                break
        # then the elastic job fails: an end task ends the run with its line and a checkpoint
        set_failpoint("task:driver.elastic")
        try:
            with pytest.raises(BackgroundTaskFailed) as err:
                for _ in it:
                    pass
        finally:
            clear_failpoints()
    for name in WORKER_RESTART_TASKS:
        assert result[f"health/task_failures/{name}"] >= 1, name
    for k in range(2):  # the learner's tasks went on: sampled and updated after they failed
        for n in ("batches_sampled", "priority_updates_applied"):
            assert result[f"replay/{k}/{n}"] > first[f"replay/{k}/{n}"], (k, n)
    assert result["health/invariant_violations"] == 0
    assert err.value.task == "driver.elastic" and "checkpoint" in str(err.value)
    assert "written" in str(err.value)


@pytest.mark.parametrize("name", ["learner.thread", "driver.recovery"])
def test_an_end_task_on_a_real_cluster_ends_the_run_with_its_line(all_workers, tmp_path, name):
    cc = all_workers
    with ApexDriver(config(), cc.client, checkpoint_dir=tmp_path / "ckpt") as driver:
        it, t0 = driver.iterate(), time.monotonic()
        for _ in it:
            if driver.last_checkpoint is not None and time.monotonic() - t0 > 3:
                break
        if name.startswith("learner."):
            where = [driver.placement["learner"]["address"]]
            cc.client.run(set_failpoint, f"task:{name}", workers=where)
        else:
            set_failpoint(f"task:{name}")
        try:
            with pytest.raises(BackgroundTaskFailed) as err:
                for _ in it:
                    pass
        finally:
            clear_failpoints()
    line = str(err.value)
    assert err.value.task == name and name in line and "\n" not in line
    assert "checkpoint" in line and "written" in line, line
