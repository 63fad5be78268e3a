"""Chaos: kill -9 the worker processes of a real cluster while it trains; the run goes on.

A `dask scheduler` and 4 `dask worker` processes (each with its nanny, which
restarts a killed worker process at a new address). Four times, about every
15 s, one worker process is killed with SIGKILL: first the worker of a
replay shard, then the learner's, then two drawn at random. The learner and
the shards it held are rebuilt from the newest checkpoint, env workers are
re-created, and CartPole still reaches a greedy return of 475. The `faults/*`
counters equal what the kills took, and the `flow/*` counters account for
every rollout and batch.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from apex_dask.config import ApexConfig
from apex_dask.runtime.orchestration.driver import ApexDriver

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
N_WORKERS = 4


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        args, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


@pytest.fixture
def cluster(tmp_path):
    """A scheduler and 4 nanny-managed workers on loopback; a connected client."""
    from distributed import Client

    sched_file = tmp_path / "scheduler.json"
    procs = [
        _spawn(
            [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0"]
            + ["--dashboard-address", ":0", "--scheduler-file", str(sched_file)],
            tmp_path / "scheduler.log",
        )
    ]
    client = None
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            assert time.monotonic() < deadline and procs[0].poll() is None
            time.sleep(0.2)
        for i in range(N_WORKERS):
            procs.append(
                _spawn(
                    [str(BIN / "dask"), "worker", "--scheduler-file", str(sched_file)]
                    + ["--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1"]
                    + ["--name", f"w{i}", "--memory-limit", "2GiB"],
                    tmp_path / f"w{i}.log",
                )
            )
        client = Client(scheduler_file=str(sched_file), timeout=60)
        client.wait_for_workers(N_WORKERS, timeout=120)
        yield client
    finally:
        if client is not None:
            client.close()
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _on(placement: dict, address: str) -> dict[str, int]:
    """What lives on ``address``: shards, the learner, env workers (the evaluator aside)."""
    return {
        "shards": sum(w["address"] == address for w in placement["shards"]),
        "learner": int(placement["learner"]["address"] == address),
        "env_workers": sum(w["address"] == address for w in placement["env_workers"]),
    }


def test_four_kill_9s_of_worker_processes_and_the_run_still_reaches_475(cluster, tmp_path):
    cfg = ApexConfig.preset("cartpole").override(
        {
            "replay.num_shards": 3,
            "replay.placement": "spread",
            "workers.num_workers": 3,
            "topology.call_timeout_s": 10.0,
            "checkpoint.interval_s": 4.0,
            "eval.interval_s": 2.0,
            "seed": 5,
        }
    )
    rng = random.Random(7)
    took = {"shards": 0, "learner": 0, "env_workers": 0}
    kills: list[str] = []
    results: list[dict] = []
    t0 = time.monotonic()
    with ApexDriver(cfg, cluster, checkpoint_dir=tmp_path / "checkpoints") as driver:
        next_kill = t0 + 15
        for result in driver.iterate():
            results.append(result)
            now = time.monotonic()
            assert now - t0 < 420, (kills, results[-1].get("eval/return_mean"))
            if len(kills) < 4 and now >= next_kill:
                placement = driver.placement
                learner = placement["learner"]["address"]
                if len(kills) == 0:  # a shard's worker (not the learner's)
                    target = next(
                        w["address"] for w in placement["shards"] if w["address"] != learner
                    )
                elif len(kills) == 1:
                    target = learner
                else:
                    target = rng.choice(sorted(cluster.scheduler_info()["workers"]))
                for what, n in _on(placement, target).items():
                    took[what] += n
                pid = cluster.run(os.getpid, workers=[target])[target]
                os.kill(pid, signal.SIGKILL)
                kills.append(target)
                next_kill = now + 15
                continue
            done = (
                len(kills) == 4
                and result.get("eval/return_mean", 0) >= 475
                and result["faults/shards_restored"] == took["shards"]
                and result["faults/learner_restored"] == took["learner"]
                and result["faults/env_workers_replaced"] >= took["env_workers"]
            )
            if done:
                break
        final = driver.halt()
    assert len(kills) == 4
    assert took["shards"] >= 1 and took["learner"] >= 1
    last = results[-1]
    assert last["eval/return_mean"] >= 475
    assert final["faults/shards_restored"] == took["shards"]
    assert final["faults/learner_restored"] == took["learner"]
    # an env worker is replaced when one of its calls fails (the evaluator is not counted)
    assert final["faults/env_workers_replaced"] == took["env_workers"]
    # every rollout: stored, or lost (its call failed, or its shard died after storing it)
    assert final["flow/rollouts_stored"] <= final["flow/rollouts_sent"]
    lost = final["flow/rollouts_sent"] - final["flow/rollouts_stored"]
    assert final["flow/rollouts_lost"] == lost
    # every batch received: trained, waiting, or counted lost (with the learner that held it)
    received, trained = final["flow/batches_received"], final["flow/batches_trained"]
    queued, lost_batches = final["flow/batches_in_queue"], final["flow/batches_lost"]
    assert trained + queued <= received <= trained + queued + lost_batches
    if took["learner"]:
        assert lost_batches > 0 or received == trained + queued
    assert final["flow/priority_updates_sent"] <= trained
    # priority updates: applied by a shard or failed; a lost actor's counters are as of its
    # last stats (about a second before it died), so the hops agree to within that second
    applied, failed = final["flow/priority_updates_applied"], final["flow/priority_updates_failed"]
    sent = final["flow/priority_updates_sent"]
    assert abs(applied + failed - sent) <= 0.02 * sent, (applied, failed, sent)
    print(
        f"kills={len(kills)} took={took} faults="
        f"{ {k: final[k] for k in final if k.startswith('faults/')} } "
        f"flow={ {k: final[k] for k in final if k.startswith('flow/')} } "
        f"time_s={time.monotonic() - t0:.0f}"
    )
