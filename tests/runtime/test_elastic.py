"""Elastic runs on a real LocalCluster: workers join, one is retired gracefully.

The run starts on 2 worker processes (the learner's and one env-worker
process), the cluster is scaled to 4 mid-run (two env workers join), then the
first env-worker process, which also holds replay shard 0, is retired with
``client.retire_workers``. Its shard moves (the sizes before and after are equal
at the move), its env worker is retired, no fault is counted, CartPole still
reaches 475 and every ``flow/*`` pair agrees after the halt. (A kill -9 staying
a fault is ``tests/e2e/test_chaos.py``.)
"""

from __future__ import annotations

import re
import time

import pytest

from apex_dask.config import ApexConfig
from apex_dask.runtime.orchestration.cluster import start_local_cluster
from apex_dask.runtime.orchestration.driver import ApexDriver

pytestmark = pytest.mark.slow


def test_workers_join_and_one_retires_gracefully_and_cartpole_reaches_475():
    cfg = ApexConfig.preset("cartpole").override(
        {
            "topology.elastic": True,
            "workers.per_process": 1,
            "workers.num_workers": 3,
            "replay.num_shards": 2,
            "replay.placement": "spread",  # shard 0 on the env-worker process
            "topology.call_timeout_s": 20.0,
            "eval.interval_s": 2.0,
            "seed": 3,
        }
    )
    cluster, client = start_local_cluster(2, dashboard_address=None, memory_limit="2GiB")
    t0 = time.monotonic()
    try:
        with ApexDriver(cfg, client) as driver:
            first = driver.placement
            assert len([w for w in first["env_workers"] if w]) == 1
            leaving = first["shards"][0]["address"]
            assert leaving != first["learner"]["address"]
            results, stage, retired_at = [], "start", None
            for result in driver.iterate():
                results.append(result)
                assert time.monotonic() - t0 < 240, (stage, results[-1])
                if stage == "start":
                    cluster.scale(4)
                    stage = "joining"
                elif stage == "joining" and result["workers/env_workers"] == 3:
                    assert result["workers/dask_workers"] == 4
                    client.retire_workers(workers=[leaving], close_workers=True)
                    retired_at, stage = result["iteration"], "retired"
                elif stage == "retired" and result["iteration"] > retired_at + 1:
                    if result.get("eval/return_mean", 0) >= 475:
                        break
            final = driver.halt()
            changes = driver.changes
            placement = driver.placement
    finally:
        client.close()
        cluster.close()
    print(f"elastic test: {time.monotonic() - t0:.0f} s, {len(results)} results")
    assert results[-1]["eval/return_mean"] >= 475
    # the counts followed: 1 -> 3 env workers, 2 -> 4 -> 3 Dask workers
    assert final["workers/env_workers"] == 2 and final["workers/dask_workers"] == 3
    assert final["elastic/env_workers_added"] == 2
    assert final["elastic/env_workers_retired"] == 1
    assert final["elastic/shards_moved"] == 1
    assert all(w is None or w["address"] != leaving for w in placement["env_workers"])
    assert all(w["address"] != leaving for w in placement["shards"])
    # the shard held as many items after the move as before it, and all of them count
    moved = [c for c in changes if c.startswith("replay shard 0 moved")]
    assert len(moved) == 1, changes
    before, after = map(
        int, re.findall(r"(\d+) items held before the move, (\d+) after", moved[0])[0]
    )
    assert before == after > 0
    assert final["elastic/replay_items_moved"] == after
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
