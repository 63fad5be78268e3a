"""ApexDriver on real Dask clusters: placement, wiring, flow accounting, teardown, errors."""

from __future__ import annotations

import asyncio
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest

from apex_dask.config import ApexConfig
from apex_dask.runtime.orchestration.cluster import connect
from apex_dask.runtime.orchestration.driver import ApexDriver, ApexRuntimeError

pytestmark = pytest.mark.slow  # real clusters (SpecCluster, LocalCluster) and training runs


def small_config(**overrides) -> ApexConfig:
    base = {
        "replay.learning_starts": 500,
        "report.min_iter_time_s": 0.5,
        "report.timesteps_per_iteration": 500,
        "eval.interval_s": 0.0,
        "eval.episodes": 2,
        "topology.call_timeout_s": 30.0,
        "report.per_worker_keys": True,  # each env worker's own keys in the rows too
        "seed": 3,
    }
    base.update(overrides)
    return ApexConfig.preset("cartpole").override(base)


@pytest.fixture(scope="module")
def gpu_cluster():
    """Two worker processes; the second ("gpu") advertises a GPU resource."""
    from distributed import Nanny, Scheduler, SpecCluster

    opts = {"nthreads": 1, "memory_limit": "2GiB"}
    cluster = SpecCluster(
        scheduler={"cls": Scheduler, "options": {"dashboard_address": ":0"}},
        workers={
            "0": {"cls": Nanny, "options": opts},
            "gpu": {"cls": Nanny, "options": {**opts, "resources": {"GPU": 1}}},
        },
    )
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def gpu_client(gpu_cluster):
    from distributed import Client

    with Client(gpu_cluster, direct_to_workers=True) as c:
        yield c


@pytest.fixture(scope="module")
def scenario(gpu_client, tmp_path_factory):
    """Run 3 iterations, resume for one more from inside a running event loop, halt."""
    marks = tmp_path_factory.mktemp("hook") / "calls.txt"

    def hook(batch, shard_id):  # runs on the learner's worker, in its learner thread
        with open(marks, "a") as f:
            f.write(f"{os.getpid()} {shard_id}\n")
        return batch

    driver = ApexDriver(small_config(), gpu_client, before_learn_on_batch=hook)
    results = driver.run(stop={"iterations": 3})

    async def inside_a_running_loop():  # as in Jupyter: the caller's thread has a loop
        return next(driver.iterate())

    resumed = asyncio.run(inside_a_running_loop())
    final = driver.halt()
    yield {"driver": driver, "results": results, "resumed": resumed, "final": final, "marks": marks}
    driver.stop()


def test_learner_goes_to_the_worker_advertising_a_gpu(scenario, gpu_client):
    placement = scenario["driver"].placement
    assert placement["learner"]["name"] == "gpu"
    assert placement["learner"]["resources"] == {"GPU": 1}
    # shards colocated with the learner; env workers on the other worker
    assert {s["name"] for s in placement["shards"]} == {"gpu"}
    assert {w["name"] for w in placement["env_workers"]} == {"0"}


def test_before_learn_on_batch_ran_on_the_learner_worker_for_every_batch(scenario, gpu_client):
    lines = Path(scenario["marks"]).read_text().split()
    pids = {int(p) for p in lines[0::2]}
    learner_addr = scenario["driver"].placement["learner"]["address"]
    learner_pid = gpu_client.run(os.getpid, workers=[learner_addr])[learner_addr]
    assert pids == {learner_pid}
    assert len(lines) // 2 == scenario["final"]["flow/batches_trained"]
    assert {int(s) for s in lines[1::2]} == {0, 1}  # batches from both shards


def test_results_carry_every_shard_learner_and_exploration_metrics(scenario):
    results = scenario["results"]
    assert [r["iteration"] for r in results] == [1, 2, 3]
    last = results[-1]
    for k in range(2):
        assert last[f"replay/{k}/size"] > 0
        assert last[f"replay/{k}/sampled"] > 0
    assert last["replay/size"] == last["replay/0/size"] + last["replay/1/size"]
    assert last["env/epsilon/0"] == pytest.approx(0.4)
    assert last["env/epsilon/1"] == pytest.approx(0.4**8)
    assert last["learner/updates"] > 0 and last["learner/steps_trained"] > 0
    assert 0.0 < last["learner/busy_frac"] <= 1.0
    assert not math.isnan(last["learner/queue_size"])
    assert any("eval/return_mean" in r for r in results)
    assert last["eval/time_s"] > 0
    assert 0 < last["learner/replay_ratio"] <= 8.0
    assert last["timesteps_total"] >= 3 * 500
    times = [r["time_s"] for r in results]
    assert times == sorted(times) and times[0] >= 0.5


def test_weights_reach_the_env_workers(scenario):
    last = scenario["results"][-1]
    assert last["sync/weight_syncs"] > 0
    assert math.isfinite(last["sync/policy_lag"])
    assert last["sync/policy_lag"] < last["learner/version"] + 1  # workers act past version -1


def test_learner_weights_and_state_come_back_to_the_driver(scenario):
    driver, final = scenario["driver"], scenario["final"]
    version, weights = driver.learner_weights()
    assert version == final["learner/version"] > 0
    assert all(isinstance(w, np.ndarray) for w in weights.values())
    state = driver.learner_state()
    assert state["counters"]["num_updates"] == final["learner/updates"]
    assert set(state["online"]) == set(weights)


def test_resume_inside_a_running_event_loop_continues_the_run(scenario):
    assert scenario["resumed"]["iteration"] == 4
    assert scenario["resumed"]["timesteps_total"] > scenario["results"][-1]["timesteps_total"]


def test_flow_counters_agree_after_halt_so_nothing_was_lost(scenario):
    f = scenario["final"]
    assert f["flow/rollouts_sent"] == f["flow/rollouts_stored"] > 0
    assert f["flow/batches_sampled"] == f["flow/batches_received"] > 0
    assert f["flow/batches_trained"] == f["flow/batches_sampled"] - f["flow/batches_in_queue"]
    assert f["flow/priority_updates_sent"] == f["flow/batches_trained"]
    assert f["flow/priority_updates_applied"] == f["flow/priority_updates_sent"]
    assert f["flow/batches_lost"] == 0 and f["flow/priority_updates_failed"] == 0


def test_every_actor_and_the_driver_publish_metrics_to_the_scheduler(scenario, gpu_client):
    def store_view(dask_scheduler=None):
        store = dask_scheduler.plugins["apex-metrics"].store
        return store.run, sorted(store.sources), dict(store.latest)

    run, sources, latest = gpu_client.run_on_scheduler(store_view)
    assert run == scenario["driver"].run_id
    expected = {"driver", "learner", "replay/0", "replay/1", "env/0", "env/1", "eval"}
    assert expected <= set(sources)
    assert latest["learner/updates"] > 0 and latest["iteration"] >= 1


def test_cartpole_preset_learns_above_random_within_its_budget(gpu_client):
    cfg = ApexConfig.preset("cartpole").override({"seed": 1, "eval.interval_s": 2.0})
    with ApexDriver(cfg, gpu_client) as driver:
        results = driver.run(stop={"eval_return": 150, "timesteps": 80_000, "time_s": 90})
    evals = [r["eval/return_mean"] for r in results if "eval/return_mean" in r]
    # a uniformly random policy averages about 22 on CartPole-v1
    assert max(evals) >= 100, evals


def test_pendulum_preset_dpg_learns_above_random_within_its_budget(gpu_client):
    """Ape-X DPG on the same plan: float actions through shards, prefetcher and priorities."""
    cfg = ApexConfig.preset("pendulum").override({"seed": 1, "report.per_worker_keys": True})
    with ApexDriver(cfg, gpu_client) as driver:
        results = driver.run(stop={"eval_return": -600, "time_s": 75})
        final = driver.halt()
    evals = [r["eval/return_mean"] for r in results if "eval/return_mean" in r]
    # a uniformly random policy averages about -1200 on Pendulum-v1
    assert max(evals) >= -600, evals
    assert final["flow/batches_lost"] == 0 and final["learner/updates"] > 0
    assert final["flow/priority_updates_applied"] == final["flow/priority_updates_sent"] > 0
    assert final["env/epsilon/0"] == pytest.approx(0.3)  # the noise ladder's top rung


def test_min_replay_ratio_holds_env_workers_to_the_learner(gpu_client):
    cfg = small_config(**{"eval.episodes": 0})  # learner.max_replay_ratio = 8
    with ApexDriver(cfg, gpu_client, min_replay_ratio=8.0) as driver:
        results = driver.run(stop={"iterations": 4})
    # Env workers wait while trained < 8 * (items added - slack), slack = 4 fragments per
    # rollout in flight; the rollouts in flight at that moment may add one more fragment
    # each, and the learner's count of items added (what its own max_replay_ratio gate
    # reads) lags the shards' by what arrived since its last reply: allowed 3 more.
    # Free-running CartPole env workers outpace the learner (ratio ~2-3 here).
    w, last = cfg.workers, results[-1]
    fragments = w.num_workers * w.rollouts_in_flight * w.rollout_fragment_length
    steps = last["timesteps_total"]
    added = sum(last[f"replay/{k}/added"] for k in range(cfg.replay.num_shards))
    lower = 8.0 * (added - 8 * fragments) / steps
    assert lower > 4.0  # the bound still tells paced from free-running
    assert lower <= last["learner/replay_ratio"] <= 8.0 + 1e-9
    with pytest.raises(ApexRuntimeError, match="max_replay_ratio"):
        ApexDriver(cfg, gpu_client, min_replay_ratio=9.0)


def test_stop_releases_every_actor(gpu_client):
    cfg = small_config(**{"workers.num_workers": 1, "replay.num_shards": 1, "eval.episodes": 0})
    driver = ApexDriver(cfg, gpu_client)
    keys = {f.key for f in driver._actors.futures}
    assert len(keys) == 3

    def live(keys, dask_worker=None):
        return sorted(k for k in dask_worker.state.actors if k in keys)

    assert sum(len(v) for v in gpu_client.run(live, keys).values()) == 3
    driver.run(stop={"iterations": 1})
    driver.stop()
    assert all(v == [] for v in gpu_client.run(live, keys).values())
    with pytest.raises(ApexRuntimeError, match="stopped"):
        next(driver.iterate())


def test_embedded_cluster_serves_the_apex_page_and_is_closed_on_stop():
    import urllib.request

    cfg = small_config(
        **{"topology.local_workers": 1, "workers.num_workers": 1, "replay.num_shards": 1}
    )
    driver = ApexDriver(cfg, dashboard_address=":0")
    try:
        cluster = driver._cluster
        assert cluster is not None and driver.dashboard_link.endswith("/apex")
        with urllib.request.urlopen(driver.dashboard_link, timeout=10) as page:
            assert page.status == 200
        assert len(driver.run(stop={"iterations": 1})) == 1
    finally:
        driver.stop()
    assert cluster.status.name == "closed"


def test_a_hook_that_raises_stops_the_run_with_its_error(gpu_client):
    def broken(batch, shard_id):
        raise ValueError("reward scale missing")

    cfg = small_config(**{"eval.episodes": 0, "workers.num_workers": 1})
    with ApexDriver(cfg, gpu_client, before_learn_on_batch=broken) as driver:
        with pytest.raises(ApexRuntimeError, match="learner thread failed: ValueError: reward"):
            driver.run(stop={"iterations": 20})


def test_unknown_env_id_fails_before_any_actor_is_created(gpu_client):
    before = gpu_client.run(lambda dask_worker: len(dask_worker.state.actors))
    with pytest.raises(ApexRuntimeError, match="unknown environment id 'CartPol-v1'") as err:
        ApexDriver(small_config(**{"env.env_id": "CartPol-v1"}), gpu_client)
    assert "\n" not in str(err.value)
    assert gpu_client.run(lambda dask_worker: len(dask_worker.state.actors)) == before


def test_a_scheduler_without_workers_is_a_one_line_error():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            t0 = time.monotonic()
            with pytest.raises(ApexRuntimeError, match="has 0 worker") as err:
                ApexDriver(small_config(), client, worker_wait_s=1.0)
            assert time.monotonic() - t0 < 10
            assert "\n" not in str(err.value)


def test_unreachable_scheduler_fails_within_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(ApexRuntimeError, match="cannot reach the Dask scheduler") as err:
        connect("tcp://127.0.0.1:9", timeout=2)
    assert time.monotonic() - t0 < 10
    assert "\n" not in str(err.value)


def test_missing_scheduler_file_is_a_one_line_error(tmp_path):
    with pytest.raises(ApexRuntimeError, match="does not exist") as err:
        connect(scheduler_file=tmp_path / "nope.json")
    assert "\n" not in str(err.value)


def test_a_lost_env_worker_is_replaced_and_the_run_goes_on(gpu_client):
    # Runs last in this module: it kills the process of worker "0" (its nanny restarts it).
    cfg = small_config(**{"eval.episodes": 0})
    with ApexDriver(cfg, gpu_client) as driver:
        env_addr = driver.placement["env_workers"][0]["address"]
        assert driver.placement["learner"]["address"] != env_addr
        results = driver.iterate()
        before = next(results)

        async def die():  # a crash: the worker process exits at once
            os._exit(1)

        gpu_client.run(die, workers=[env_addr], wait=False)
        after = [next(results)]
        while after[-1]["faults/env_workers_replaced"] < 2 and len(after) < 60:
            after.append(next(results))  # replacements may finish an iteration apart
        after += [next(results), next(results)]
        driver.halt()
        moved = {w["address"] for w in driver.placement["env_workers"]}
    assert after[-1]["faults/env_workers_replaced"] == 2
    assert env_addr not in moved
    assert after[-1]["timesteps_total"] > after[0]["timesteps_total"] > before["timesteps_total"]
    assert after[-1]["learner/updates"] > before["learner/updates"]


def test_a_lost_learner_is_rebuilt_with_its_shards_and_the_run_goes_on(gpu_client):
    # Kills the learner's worker process (its nanny restarts it, at another address).
    # Without a checkpoint the learner comes back with fresh weights and its shards
    # (on its worker, by default) come back empty, on the surviving worker (the
    # restarted "gpu" worker is usually not back yet when the loss is seen).
    cfg = small_config(**{"eval.episodes": 0, "topology.call_timeout_s": 5.0})
    with ApexDriver(cfg, gpu_client) as driver:
        learner_addr = driver.placement["learner"]["address"]
        results = driver.iterate()
        before = next(results)
        assert before["faults/learner_restored"] == 0

        async def die():
            os._exit(1)

        gpu_client.run(die, workers=[learner_addr], wait=False)
        deadline = time.monotonic() + 120
        after = []
        for result in results:
            if result["faults/learner_restored"] >= 1:
                after.append(result)
            if len(after) >= 3:
                break
            assert time.monotonic() < deadline, result
        placement = driver.placement
    assert [r["faults/learner_restored"] for r in after] == [1, 1, 1]
    assert after[0]["faults/shards_restored"] == cfg.replay.num_shards
    assert placement["learner"]["address"] != learner_addr
    assert all(w["address"] != learner_addr for w in placement["shards"])
    assert after[-1]["learner/steps_trained"] > after[0]["learner/steps_trained"]


def test_env_workers_act_with_the_learners_weights_from_their_first_rollout(gpu_client):
    """No periodic sync ever comes due; each env worker still got the initial weights first."""
    cfg = small_config(**{"workers.max_weight_sync_delay": 10**9, "eval.episodes": 0})
    with ApexDriver(cfg, gpu_client) as driver:
        results = driver.run(stop={"iterations": 2})
        envs = [s.handle.stats().result() for s in driver._plan.state.slots]
    n = cfg.workers.num_workers
    assert [e[f"env/{i}/weights_version"] for i, e in enumerate(envs)] == [0] * n
    assert results[-1]["sync/weight_syncs"] == n


def test_before_learn_on_batch_named_in_the_config_runs_on_the_learner(gpu_client):
    cfg = small_config(
        **{"learner.before_learn_on_batch": "learner_hooks:scale_weights", "eval.episodes": 0}
    )
    with ApexDriver(cfg, gpu_client) as driver:
        driver.run(stop={"iterations": 2})
        final = driver.final
    assert final["learner/hook_calls"] == final["flow/batches_trained"] > 0
