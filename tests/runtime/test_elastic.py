"""Elastic runs on a real LocalCluster: workers join, two are retired gracefully.

The run starts on 2 worker processes (the learner's and one env-worker
process), the cluster is scaled to 4 mid-run (two env workers join), then the
first env-worker process, which also holds replay shard 0, is retired with
``client.retire_workers``: its shard moves (the sizes before and after are equal
at the move) and its env worker is retired. Then the learner's own worker is
retired: the shards there move and the learner moves from a fresh snapshot of
itself (its weights version and steps trained go on; a rebuild would start from
a checkpoint or from scratch). No fault is counted, CartPole still reaches 475
and every ``flow/*`` pair agrees after the halt. Each joined worker's first
rollout is timed from its join (printed; the target is in docs/benchmarks.md).
(A kill -9 staying a fault is ``tests/e2e/test_chaos_matrix.py``.)
"""

from __future__ import annotations

import re
import time

import pytest
from polling import poll

from apex_dask.config import ApexConfig
from apex_dask.runtime.orchestration.cluster import start_local_cluster
from apex_dask.runtime.orchestration.driver import ApexDriver

pytestmark = pytest.mark.slow


def test_workers_join_then_a_shard_and_the_learner_move_off_retiring_workers():
    cfg = ApexConfig.preset("cartpole").override(
        {
            "topology.elastic": True,
            "workers.per_process": 1,
            "workers.num_workers": 3,
            "replay.num_shards": 2,
            "replay.placement": "spread",  # shard 0 on the env-worker process
            "topology.call_timeout_s": 20.0,
            "eval.interval_s": 2.0,
            "eval.episodes": 5,  # half the preset's: the evaluator competes for the 2 cores
            "seed": 3,
        }
    )
    cluster, client = start_local_cluster(2, dashboard_address=None, memory_limit="2GiB")
    t0 = time.monotonic()
    log = []  # (seconds since the start, stage) for the printout

    def retire(address: str) -> None:
        _retire(client, address)
        log.append((round(time.monotonic() - t0, 1), f"retired {address}"))

    try:
        with ApexDriver(cfg, client) as driver:
            first = driver.placement
            assert len([w for w in first["env_workers"] if w]) == 1
            leaving = first["shards"][0]["address"]
            learner_was = first["learner"]["address"]
            assert leaving != learner_was
            results, stage, moved_at, before = [], "joining", None, {}
            cluster.scale(4)  # two workers join while the run starts training
            for result in driver.iterate():
                results.append(result)
                assert time.monotonic() - t0 < 270, (stage, results[-1])
                if stage == "joining" and result["workers/env_workers"] == 3:
                    assert result["workers/dask_workers"] == 4
                    log.append((round(time.monotonic() - t0, 1), "3 env workers"))
                    retire(leaving)
                    before = driver.learner_state()["counters"]  # just before its move
                    shards_there = [w["address"] for w in driver.placement["shards"]]
                    retire(learner_was)
                    after = driver.learner_state()["counters"]  # the new learner's, at once
                    moved_at, stage = results[-1]["iteration"], "learner moved"
                elif stage == "learner moved" and result["iteration"] > moved_at + 1:
                    if result.get("eval/return_mean", 0) >= 475:
                        break
            final = driver.halt()
            changes = driver.changes
            placement = driver.placement
    finally:
        client.close()
        cluster.close()
    print(f"elastic test: {time.monotonic() - t0:.0f} s, {len(results)} results, {log}")
    print("\n".join(changes))
    assert results[-1]["eval/return_mean"] >= 475
    # the counts followed: 1 -> 3 -> 2 env workers, 2 -> 4 -> 3 -> 2 Dask workers
    assert final["workers/env_workers"] == 2 and final["workers/dask_workers"] == 2
    assert final["elastic/env_workers_added"] == 2
    assert final["elastic/env_workers_retired"] == 1
    gone = {leaving, learner_was}
    assert all(w is None or w["address"] not in gone for w in placement["env_workers"])
    moves = (final, changes, placement, shards_there, before, after)
    sizes = _shards_and_learner_moved_whole(*moves, leaving=leaving, learner_was=learner_was)
    assert final["elastic/replay_items_moved"] == sum(sizes)
    # each joined worker's env worker ran within the run; the seconds from its join
    joins = [float(x) for c in changes for x in re.findall(r"first rollout ([\d.]+) s after", c)]
    assert len(joins) == 2, changes
    print(f"join to first stored rollout: {joins} s")
    _no_fault_and_every_hop_agrees(final)


def _retire(client, address: str) -> None:
    """Retire one Dask worker gracefully; returns once the scheduler no longer lists it."""
    client.retire_workers(workers=[address], close_workers=True)  # returns once moved off

    def retired() -> bool:  # Dask retired it: nothing of the run was left on it
        return address not in client.scheduler_info(n_workers=-1)["workers"]

    poll(retired, 30)


def _shards_and_learner_moved_whole(
    final, changes, placement, shards_there, before, after, *, leaving, learner_was
) -> list[int]:
    """Shard 0 moved off ``leaving``, then every shard on the learner's worker and the
    learner itself moved; each moved shard held as many items after its move as before
    (returned), and the learner went on from a fresh snapshot of itself: neither its
    weights version nor its steps trained went back (no checkpoint restore, no fresh
    start), and it trained on."""
    assert final["elastic/shards_moved"] == 1 + shards_there.count(learner_was)
    assert final["elastic/learner_moved"] == 1
    gone = {leaving, learner_was}
    assert all(w["address"] not in gone for w in placement["shards"])
    assert placement["learner"]["address"] not in gone
    moved = [c for c in changes if c.startswith("replay shard ")]
    assert len(moved) == final["elastic/shards_moved"], changes
    sizes = [re.findall(r"(\d+) items held before the move, (\d+) after", c)[0] for c in moved]
    assert all(int(b) == int(a) > 0 for b, a in sizes), moved
    [line] = [c for c in changes if c.startswith("the learner moved")]
    version = int(re.findall(r"weights version (\d+)", line)[0])
    assert after["version"] >= version >= before["version"] > 0
    assert after["steps_trained"] >= before["steps_trained"] > 0
    assert final["learner/version"] > version  # and it trained on
    return [int(a) for _, a in sizes]


def _no_fault_and_every_hop_agrees(final: dict) -> None:
    # no fault: nothing replaced, restored, lost or failed
    assert {k: v for k, v in final.items() if k.startswith("faults/") and v} == {}
    # every hop's counters agree after the halt
    assert final["flow/rollouts_sent"] == final["flow/rollouts_stored"]
    assert final["flow/rollouts_lost"] == 0
    assert final["flow/batches_sampled"] == final["flow/batches_received"]
    assert (
        final["flow/batches_received"]
        == final["flow/batches_trained"] + final["flow/batches_in_queue"]
    )
    assert final["flow/batches_lost"] == 0
    assert final["flow/priority_updates_sent"] == final["flow/priority_updates_applied"]
    assert final["flow/priority_updates_failed"] == 0


def test_an_r2d2_run_moves_its_sequence_shards_and_its_recurrent_learner_off_retiring_workers():
    """The r2d2 agent on the same hand-over: ``--preset cartpole_pomdp`` elastic on 3
    worker processes; the env-worker process holding shard 0 is retired, then the
    learner's. Sequence items move whole (sizes equal at each move), the LSTM learner
    moves from a snapshot of itself (version and steps trained go on) and trains on,
    with its stored-state staleness still reported, and no fault is counted."""
    cfg = ApexConfig.preset("cartpole_pomdp").override(
        {
            "topology.elastic": True,
            "workers.per_process": 1,
            "workers.num_workers": 2,
            "replay.placement": "spread",
            "replay.learning_starts": 20,
            "topology.call_timeout_s": 20.0,
            "eval.episodes": 0,  # no evaluator: the 2 cores go to training
            "seed": 5,
        }
    )
    cluster, client = start_local_cluster(3, dashboard_address=None, memory_limit="2GiB")
    t0 = time.monotonic()
    try:
        with ApexDriver(cfg, client) as driver:
            first = driver.placement
            leaving = first["shards"][0]["address"]
            learner_was = first["learner"]["address"]
            assert leaving != learner_was
            results, moved_at, before = [], None, {}
            for result in driver.iterate():
                results.append(result)
                assert time.monotonic() - t0 < 240, results[-1]
                if moved_at is None and result["learner/updates"] >= 20:
                    _retire(client, leaving)
                    before = driver.learner_state()["counters"]
                    shards_there = [w["address"] for w in driver.placement["shards"]]
                    _retire(client, learner_was)
                    after = driver.learner_state()["counters"]
                    moved_at = result["iteration"]
                elif moved_at is not None and result["iteration"] > moved_at + 2:
                    break
            final = driver.halt()
            changes = driver.changes
            placement = driver.placement
    finally:
        client.close()
        cluster.close()
    print(f"r2d2 elastic test: {time.monotonic() - t0:.0f} s, {len(results)} results")
    print("\n".join(changes))
    moves = (final, changes, placement, shards_there, before, after)
    _shards_and_learner_moved_whole(*moves, leaving=leaving, learner_was=learner_was)
    assert final["learner/state_staleness"] >= 0.0
    _no_fault_and_every_hop_agrees(final)
