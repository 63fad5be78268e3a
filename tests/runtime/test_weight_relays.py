"""Weights leave the learner once per host: a relay per host serves its env workers.

Real processes: a scheduler, a learner worker (GPU resource: the learner and
the shards) and two env-worker processes, all on one host (127.0.0.1): one
relay for the host, on one of the env-worker processes. The learner counts the
blobs it hands out (``learner/weight_sends``); with the relay that is one per
version for the host, whatever the number of env workers. A relay that fails
or is lost costs no sync and no rollout: env workers pull from the learner.
"""

from __future__ import annotations

import os
import pickle
import time

import pytest

from apex_dask.config import ApexConfig
from apex_dask.runtime.actors.failpoints import clear_failpoints, set_failpoint
from apex_dask.runtime.orchestration.driver import ApexDriver

# a cluster and a short training run (4 minutes each at a load average of 20 on 2 cores)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WORKERS = 6


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


def config(relays: bool = True, **extra) -> ApexConfig:
    return ApexConfig.preset("cartpole").override(
        {
            "simulate.env_steps_per_s": 400.0,
            "workers.num_workers": WORKERS,
            "workers.rollout_fragment_length": 20,
            "workers.max_weight_sync_delay": 20,  # a sync after every rollout
            "replay.num_shards": 2,
            "replay.learning_starts": 200,
            "learner.min_replay_ratio": None,
            "learner.max_replay_ratio": 0.5,  # the learner leaves the env processes CPU
            "eval.episodes": 0,
            "report.min_iter_time_s": 1.0,
            "report.timesteps_per_iteration": 0,
            "report.strict_invariants": True,
            "topology.weight_relays": relays,
            "topology.call_timeout_s": 30.0,
            "seed": 3,
            **extra,
        }
    )


def until(results, test, timeout_s: float = 120.0) -> dict:
    """The first result that passes ``test`` (polled with a deadline)."""
    deadline = time.monotonic() + timeout_s
    for r in results:
        if test(r):
            return r
        assert time.monotonic() < deadline, f"not reached in {timeout_s} s; last {r}"
    raise AssertionError("the run ended first")


def until_pair(results, test, timeout_s: float = 120.0) -> tuple[dict, dict]:
    """The first result past the first one that passes ``test``, and the result before it."""
    deadline = time.monotonic() + timeout_s
    before = None
    for r in results:
        if before is not None and test(r):
            return before, r
        before = r
        assert time.monotonic() < deadline, f"not reached in {timeout_s} s; last {r}"
    raise AssertionError("the run ended first")


def sends_and_versions(a: dict, b: dict) -> tuple[float, float, float]:
    """Between two results: blobs the learner sent, versions it made, syncs applied."""
    return (
        b["learner/weight_sends"] - a["learner/weight_sends"],
        b["learner/version"] - a["learner/version"],
        b["sync/weight_syncs"] - a["sync/weight_syncs"],
    )


def env_counts(driver: ApexDriver, name: str) -> list[float]:
    """Each env worker's own counter ``env/<i>/<name>``, asked of it (after a halt: final)."""
    state = driver._state  # noqa: SLF001 - the env workers' own counters
    return [
        slot.handle.stats().result(timeout=30)[f"env/{slot.index}/{name}"] for slot in state.slots
    ]


def test_each_version_leaves_the_learner_once_for_the_host(cluster):
    # The learner is held to 0.1 transitions trained per transition stored: with
    # fragments of 20 and batches of 64 the env workers sync about 32 times per version
    # in all (5 each), whatever the machine's load (both rates follow the env steps), so
    # a blob per env worker would be about 6 per version and fail below. (One shard: at
    # that ratio two would each be sampled too seldom for the sampling law.)
    slow = {"learner.max_replay_ratio": 0.1, "replay.num_shards": 1}
    with ApexDriver(config(**slow), cluster) as driver:
        results = driver.iterate()
        before, first = until_pair(
            results, lambda r: r.get("relay/served", 0) > 0 and r["learner/version"] > 2
        )
        later = until(results, lambda r: r["learner/version"] > first["learner/version"] + 10, 240)
        sends, versions, syncs = sends_and_versions(first, later)
        assert later["relay/count"] == 1  # one host
        # at most one blob per version for the host: each blob the learner sent after
        # ``first`` is of a version past the one the relay held then, which is at least
        # the newest an env worker had taken from it at the result before (the env
        # workers' stats of ``first`` itself are asked after the learner's); the env
        # workers took many more
        held = before["env/workers/weights_version/max"]
        assert sends <= later["learner/version"] - held, (sends, versions, held)
        assert syncs > 2 * sends, (syncs, sends)
        relayed = later["relay/blobs_in"] - first["relay/blobs_in"]
        assert later["relay/served"] - first["relay/served"] > relayed
        assert later["relay/repeat_blobs"] == 0
        assert later["health/invariant_violations"] == 0
        # the lag keeps its meaning: the env workers' mean version at ``later`` is past the
        # learner's version at ``first`` (a bound that holds on a loaded machine too; a row's
        # lag itself may dip below 0 there: the learner's stats are asked before the env
        # workers')
        assert later["learner/version"] - later["sync/policy_lag"] > first["learner/version"]
        final = driver.halt()
        state, ref = driver._state, driver._actors.learner_ref  # noqa: SLF001 - the actors checked
        # halted, every hop's counters agree: each blob the learner sent went to the relay,
        # each of a version it did not hold, or to an env worker pulling its own before it
        # was told the relay (about one each; no relay call failed)
        pulled = env_counts(driver, "direct_blobs")
        sent = final["learner/weight_sends"]
        assert sent == final["relay/blobs_in"] + sum(pulled), (
            sent,
            final["relay/blobs_in"],
            pulled,
        )
        assert final["relay/repeat_blobs"] == 0 and final["relay/failed"] == 0
        # at most one blob per version the learner made, its first weights (version 0)
        # included
        assert final["relay/blobs_in"] <= final["learner/version"] + 1
        assert sum(pulled) <= 2 * WORKERS, pulled
        # what the relay hands out is the learner's blob (halted: one version), and an env
        # worker syncing through it applies that version
        direct = state.learner.weights_if_newer(-1).result(timeout=30)
        relay = next(iter(state.relays.values()))
        relayed = relay.handle.weights_if_newer(-1, ref).result(timeout=30)
        assert relayed == direct
        version, weights = pickle.loads(relayed)
        assert version == driver.learner_weights()[0]
        assert all(k in weights for k in driver.learner_weights()[1])
        slot = state.slots[0]
        slot.handle.set_learner(ref).result(timeout=30)  # its weights version starts afresh
        assert slot.handle.sync_weights().result(timeout=30) == version


def test_without_relays_every_env_worker_pulls_its_own_copy(cluster):
    with ApexDriver(config(relays=False), cluster) as driver:
        results = driver.iterate()
        rows = []

        def seen(r: dict, test) -> bool:
            rows.append(r)
            return test(r)

        first = until(results, lambda r: seen(r, lambda r: r["learner/version"] > 5))
        later = until(
            results,
            lambda r: seen(r, lambda r: r["learner/version"] > first["learner/version"] + 20),
        )
        assert "relay/count" not in later or later["relay/count"] == 0
        sends, _, syncs = sends_and_versions(first, later)
        assert sends > 2 * WORKERS and syncs > 2 * WORKERS, (sends, syncs)
        # one send per sync, in every row: the learner's stats are asked before the
        # driver counts its syncs, so a row's sends exceed its syncs only by the syncs on
        # their way back then, at most one per env worker (a difference of two rows has
        # no such bound: syncs made between asking the learner and counting are in one
        # row's count and not in its sends)
        for r in rows:
            assert r["learner/weight_sends"] <= r["sync/weight_syncs"] + WORKERS, r
        final = driver.halt()
        pulled = env_counts(driver, "direct_blobs")
        # halted, every call finished: each blob the learner sent is one sync the driver
        # counted and one blob an env worker pulled itself, exactly
        assert final["learner/weight_sends"] == final["sync/weight_syncs"] == sum(pulled), (
            final["learner/weight_sends"],
            final["sync/weight_syncs"],
            pulled,
        )
        assert all(p > 0 for p in pulled), pulled


def _set(name: str) -> None:
    set_failpoint(name)


def test_a_failing_relay_costs_no_sync_and_no_rollout(cluster):
    # each env worker's own relay_fallbacks: in the rows only with report.per_worker_keys
    with ApexDriver(config(**{"report.per_worker_keys": True}), cluster) as driver:
        results = driver.iterate()
        first = until(results, lambda r: r.get("relay/served", 0) > 0)
        cluster.run(_set, "relay_fails")
        try:
            failing = until(results, lambda r: r["relay/failed"] > first["relay/failed"] + 20)
            fallbacks = sum(failing.get(f"env/{i}/relay_fallbacks", 0) for i in range(WORKERS))
            # each fallback is a relay call that failed: the relay counts the failure before
            # the env worker sees it, and the env workers' stats are asked before the
            # relay's (the other way round is exact once halted, below)
            assert 0 < fallbacks <= failing["relay/failed"], (fallbacks, failing["relay/failed"])
            assert failing["sync/weight_syncs"] > first["sync/weight_syncs"]  # syncs go on
        finally:
            cluster.run(clear_failpoints)
        after = until(results, lambda r: r["relay/served"] > failing["relay/served"] + 10)
        # (a row's flow/rollouts_lost is sent - stored, the rollouts in transit included:
        # no rollout lost is the final sent = stored below)
        assert after["faults/env_workers_replaced"] == after["faults/rollouts_failed"] == 0
        assert after["health/invariant_violations"] == 0
        final = driver.halt()
        fell_back = env_counts(driver, "relay_fallbacks")
    assert final["flow/rollouts_sent"] == final["flow/rollouts_stored"]
    # halted, every call finished: each failed relay call was one fallback, exactly
    assert sum(fell_back) == final["relay/failed"] > 20, (fell_back, final["relay/failed"])


async def _die():  # a crash: the worker process ends at once (its nanny restarts it)
    os._exit(1)


def test_a_lost_relay_is_replaced_and_its_env_workers_go_on(cluster):
    with ApexDriver(config(), cluster) as driver:
        results = driver.iterate()
        until(results, lambda r: r.get("relay/served", 0) > 0)
        relay = next(iter(driver._state.relays.values()))  # noqa: SLF001
        cluster.run(_die, workers=[relay.address], wait=False)
        after = until(
            results,
            lambda r: (
                r["faults/env_workers_replaced"] > 0
                and r["relay/count"] == 1
                and driver._state.relays  # noqa: SLF001
                and next(iter(driver._state.relays.values())).address != relay.address
            ),  # noqa: SLF001
        )
        served = after["relay/served"]
        again = until(results, lambda r: r["relay/served"] > served + 10)
        assert again["health/invariant_violations"] == 0
        assert again["learner/steps_trained"] > after["learner/steps_trained"]


def test_the_relays_law_trips_on_a_relay_that_loses_count(cluster):
    from apex_dask.runtime.errors import InvariantViolated

    with ApexDriver(config(), cluster) as driver:
        results = driver.iterate()
        until(results, lambda r: r.get("relay/served", 0) > 0)
        cluster.run(_set, "relay_uncounted")
        try:
            with pytest.raises(InvariantViolated) as err:
                until(results, lambda r: False, timeout_s=60)
        finally:
            cluster.run(clear_failpoints)
    assert err.value.law == "relays" and "requests but served" in str(err.value)


def test_a_relay_with_a_max_age_asks_the_learner_at_most_once_per_age(cluster):
    """``topology.weight_relay_max_age_s``: a copy that young answers a sync, so the relay
    asks the learner about once per that many seconds, however often its env workers
    sync; the env workers still take new versions and the lag stays bounded."""
    age = 2.0
    with ApexDriver(config(**{"topology.weight_relay_max_age_s": age}), cluster) as driver:
        results = driver.iterate()
        before, first = until_pair(
            results, lambda r: r.get("relay/served", 0) > 0 and r["learner/version"] > 5
        )
        later = until(results, lambda r: r["time_s"] > first["time_s"] + 12)
        elapsed = later["time_s"] - first["time_s"]
        asks = later["relay/asks"] - first["relay/asks"]
        requests = later["relay/requests"] - first["relay/requests"]
        assert asks <= elapsed / age + 2, (asks, elapsed)
        assert requests > 3 * asks, (requests, asks)
        sends, _, syncs = sends_and_versions(first, later)
        # each blob sent after ``first``'s learner stats is an ask the relay counted after
        # its stats of the row before (asked before ``first``'s learner stats), or the one
        # ask on its way back (counted by the learner, not yet by the relay)
        asked = later["relay/asks"] - before["relay/asks"]
        assert sends <= asked + 1 and syncs > 2 * sends, (sends, asked, syncs)
        assert later["relay/served"] > first["relay/served"]
        assert later["relay/repeat_blobs"] == 0
        assert later["health/invariant_violations"] == 0
        # the env workers still take new versions: their mean version at ``later`` is past
        # the learner's version at ``first``
        assert later["learner/version"] - later["sync/policy_lag"] > first["learner/version"]


def test_env_workers_that_join_take_the_relay_and_a_retired_relay_worker_hands_it_on():
    """Elastic: a worker that joins gets env workers that sync through the host's relay;
    retiring the relay's worker on purpose releases the relay, the host gets one on a
    worker still holding env workers, and nothing is lost or counted as a fault."""
    from apex_dask.runtime.orchestration.cluster import start_local_cluster

    cfg = config(
        **{
            "topology.elastic": True,
            "workers.per_process": 2,
            "workers.num_workers": 4,
            "report.per_worker_keys": True,
        }
    )
    cluster, client = start_local_cluster(2, dashboard_address=None, memory_limit="2GiB")
    try:
        with ApexDriver(cfg, client) as driver:
            state = driver._state  # noqa: SLF001 - the relays and slots checked
            results = driver.iterate()
            until(results, lambda r: r.get("relay/served", 0) > 0)
            [old] = state.relays.values()
            cluster.scale(3)  # a worker joins: two env workers there
            joined = until(results, lambda r: r["workers/env_workers"] == 4)
            new = [s.index for s in state.slots if s.address != old.address]
            assert len(new) == 2, [(s.index, s.address) for s in state.slots]
            took = until(
                results,
                lambda r: (
                    all(r.get(f"env/{i}/relay_syncs", 0) > 0 for i in new)
                    and r["learner/version"] > joined["learner/version"]
                ),
            )
            client.retire_workers(workers=[old.address], close_workers=True)
            after = until(
                results,
                lambda r: (
                    r["workers/env_workers"] == 2
                    and r["relay/count"] == 1
                    and state.relays
                    and next(iter(state.relays.values())).address != old.address
                ),
            )
            served = after["relay/served"]
            again = until(results, lambda r: r["relay/served"] > served + 10)
            assert all(again[f"env/{i}/relay_syncs"] > took[f"env/{i}/relay_syncs"] for i in new)
            final = driver.halt()
    finally:
        client.close()
        cluster.close()
    assert final["elastic/env_workers_added"] == 2 and final["elastic/env_workers_retired"] == 2
    assert {k: v for k, v in final.items() if k.startswith("faults/") and v} == {}
    assert final["flow/rollouts_sent"] == final["flow/rollouts_stored"]
    assert final["flow/rollouts_lost"] == 0
    assert final["health/invariant_violations"] == 0
