"""Replacing a lost env worker when the worker chosen for it dies before the actor exists.

An actor is pinned to the worker placement chose; if that worker dies while the
actor is being created, the scheduler holds the creation for ever (the worker
never comes back as itself). The replacement must notice, give that worker up
and create the actor on another one, and the run must go on with every slot
acting. Real processes: a scheduler and three worker processes (one with the
GPU resource: the learner and the shards), an env whose construction blocks
while a flag file exists (``tests/flagged_envs.py``), so the creation is
caught half-way.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))  # flagged_envs, here and (via PYTHONPATH) in the workers
os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])

from apex_dask.config import ApexConfig  # noqa: E402
from apex_dask.runtime.orchestration.driver import ApexDriver  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster():
    from distributed import Client, Nanny, Scheduler, SpecCluster

    opts = {"nthreads": 1, "memory_limit": "2GiB"}
    spec = SpecCluster(
        scheduler={"cls": Scheduler, "options": {"dashboard_address": ":0"}},
        workers={
            "learner": {"cls": Nanny, "options": {**opts, "resources": {"GPU": 1}}},
            "a": {"cls": Nanny, "options": opts},
            "b": {"cls": Nanny, "options": opts},
        },
    )
    with spec, Client(spec, direct_to_workers=True) as client:
        yield client


def creating_on(client) -> str | None:
    """The worker an env worker actor is being created on now (None: none is)."""
    for address, keys in client.processing().items():
        if any(str(k).startswith("EnvWorkerActor") for k in keys):
            return address
    return None


def test_a_worker_that_dies_while_an_env_worker_is_created_on_it_is_given_up(cluster, tmp_path):
    flag = tmp_path / "hold-env-construction"
    cfg = ApexConfig.preset("cartpole").override(
        {
            "env.env_id": "flagged_envs:WaitOnFlag-v0",
            "env.env_kwargs": {"flag": str(flag)},
            "replay.learning_starts": 200,
            "report.min_iter_time_s": 0.5,
            "report.timesteps_per_iteration": 200,
            "eval.episodes": 0,
            "topology.call_timeout_s": 30.0,
            "report.per_worker_keys": True,  # each env worker's steps in the rows
            "seed": 5,
        }
    )

    async def die():  # a crash: the worker process ends at once (its nanny restarts it)
        os._exit(1)

    with ApexDriver(cfg, cluster) as driver:
        first = driver.placement["env_workers"][0]["address"]
        results = driver.iterate()
        next(results)
        flag.touch()  # from now on, making the env blocks
        cluster.run(die, workers=[first], wait=False)
        deadline = time.monotonic() + 60
        while (chosen := creating_on(cluster)) is None:
            assert time.monotonic() < deadline, "no replacement was started"
            time.sleep(0.05)
        cluster.run(die, workers=[chosen], wait=False)  # the worker chosen dies half-way
        gone = time.monotonic()
        while any(chosen in keys for keys in [cluster.scheduler_info()["workers"]]):
            assert time.monotonic() < deadline, "the chosen worker did not go"
            time.sleep(0.05)
        flag.unlink()  # later creations go through

        seen: list[dict] = []
        while time.monotonic() < gone + 90:
            r = next(results)
            seen.append(r)
            placed = {w["address"] for w in driver.placement["env_workers"]}
            alive = set(cluster.scheduler_info()["workers"])
            if placed <= alive and all(r.get(f"env/{i}/steps_sampled", 0) > 0 for i in (0, 1)):
                break
        notes = driver.notes
        driver.halt()
    assert placed <= alive, (placed, alive, notes)  # every slot on a live worker
    assert chosen not in placed and first not in placed
    assert seen[-1]["faults/env_workers_replaced"] >= 1, notes
    # both slots act again: their (new) actors have sampled steps
    assert all(seen[-1][f"env/{i}/steps_sampled"] > 0 for i in (0, 1)), seen[-1]
    assert any("left while an actor was being created on it" in n for n in notes), notes
