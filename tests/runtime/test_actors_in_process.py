"""The actor classes in this process, without Dask: their async methods awaited directly.

A Dask worker runs these same objects and methods on its event loop; here one
``asyncio.run`` stands in for that loop. Shards are passed to the env worker
and the prefetcher as local objects, as the learner's worker does for the
shards it holds. The learner actor needs a Dask worker (``get_worker()``),
so its weights come from :class:`WeightsSource`, which answers
``weights_if_newer`` as the learner actor does. The same pieces on a real
cluster: ``test_actors.py``.
"""

from __future__ import annotations

import asyncio
import pickle
import queue
import time

import numpy as np
import pytest
from agent_parts import CPU

from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.learner import Learner
from apex_dask.algo.agents.spec import AgentSpec, WorkerSpec
from apex_dask.algo.envs.factory import make_env_factory
from apex_dask.algo.envs.probe import probe_spaces
from apex_dask.algo.replay.storage import GENERATION_EPOCH
from apex_dask.algo.rollout.spec import RolloutSpec
from apex_dask.experiment.checkpoints.store import CheckpointError
from apex_dask.runtime.actors import EnvWorkerActor, ReplayShardActor
from apex_dask.runtime.actors.prefetch import ReplayPrefetcher, ShardLinks

HIDDENS = (16,)


def transitions(n: int, seed: int) -> dict[str, np.ndarray]:
    """``n`` CartPole-shaped items (obs of 4 floats, 2 actions)."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n + 1, 4)).astype(np.float32)
    return {
        "obs": obs[:-1],
        "next_obs": obs[1:],
        "action": rng.integers(0, 2, size=n),
        "reward": np.ones(n, np.float32),
        "done": np.zeros(n, np.float32),
        "discount": np.full(n, 0.99**3, np.float32),
    }


def shard(shard_id: int, **kwargs) -> ReplayShardActor:
    kwargs = {"capacity": 1024, "batch_size": 8, "seed": shard_id, **kwargs}
    return ReplayShardActor(shard_id, kwargs.pop("capacity"), **kwargs)


async def until(condition, timeout_s: float = 30.0) -> None:
    """Yield to the loop until ``condition()`` holds; ``AssertionError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        await asyncio.sleep(0.01)


class WeightsSource:
    """The learner actor's ``weights_if_newer``: one pickled ``(version, weights)`` blob."""

    def __init__(self, version: int, weights: dict[str, np.ndarray]) -> None:
        self.version, self.weights, self.asked = version, weights, 0

    async def weights_if_newer(self, version: int) -> bytes | None:
        self.asked += 1
        return pickle.dumps((self.version, self.weights)) if self.version > version else None

    async def versioned_weights_if_newer(self, version: int) -> tuple[int, bytes] | None:
        """What a weights relay asks: ``(version, blob)`` if newer."""
        blob = await self.weights_if_newer(version)
        return None if blob is None else (self.version, blob)


class LostLearner:
    """A learner actor whose worker died: a call made to it from another actor never
    answers (Dask's behaviour; ``apex_dask/runtime/actors/calls.py``)."""

    def __init__(self) -> None:
        self.asked = 0

    async def versioned_weights_if_newer(self, version: int) -> tuple[int, bytes] | None:
        self.asked += 1
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def test_shard_answers_none_below_learning_starts_then_batches_and_takes_priorities():
    async def scenario():
        s = shard(2, learning_starts=50)
        assert await s.add(transitions(40, 0)) == 40
        assert await s.sample() is None
        assert await s.add(transitions(40, 1), np.full(40, 5.0, np.float32)) == 80
        batch = await s.sample()
        await s.update_priorities(batch.indices, np.full(8, 0.5, np.float32), batch.generations)
        stats = await s.stats()
        await s.close()
        return batch, stats, await s.added()

    batch, stats, added = asyncio.run(scenario())
    assert batch.shard_id == 2 and batch.added == 80 == added
    assert batch.data["obs"].shape == (8, 4) and batch.indices.shape == (8,)
    assert np.all((batch.weights > 0) & (batch.weights <= 1.0))
    assert stats["replay/2/size"] == 80
    assert stats["replay/2/rollouts_stored"] == 2
    assert stats["replay/2/batches_sampled"] == 1
    assert stats["replay/2/priority_updates_applied"] == 1


def test_shard_checkpoint_part_restores_into_a_new_shard_and_refuses_another_capacity(tmp_path):
    t0 = 0

    async def scenario():
        a = shard(0)
        await a.add(transitions(100, 2), np.linspace(0.1, 3.0, 100, dtype=np.float32))
        entry = await a.save_part(str(tmp_path), "shard-0")
        b = shard(0)
        held = await b.load_part(str(tmp_path), entry)
        same = [await a.state_dict(), await b.state_dict()]
        with pytest.raises(CheckpointError, match="does not fit replay shard 0"):
            await shard(0, capacity=64).load_part(str(tmp_path), entry)
        return held, same

    held, (before, after) = asyncio.run(scenario())
    assert held == 100
    assert before.keys() == after.keys()
    for key in before.keys() - {"clock"}:
        np.testing.assert_equal(after[key], before[key])
    # a restore moves the clock on, past the wall clock too (storage.ItemStorage)
    assert after["clock"] >= max(before["clock"], t0) + GENERATION_EPOCH


def test_env_worker_stores_each_rollout_in_the_named_shard_and_takes_only_newer_weights():
    factory = make_env_factory("CartPole-v1")
    obs_space, act_space = probe_spaces(factory)
    weights = Learner(obs_space, act_space, DQNConfig(hiddens=HIDDENS), CPU).get_weights()[1]
    source = WeightsSource(7, weights)
    shards = [shard(0, learning_starts=10**6), shard(1, learning_starts=10**6)]
    spec = WorkerSpec(
        AgentSpec("dqn", DQNConfig(hiddens=HIDDENS)), RolloutSpec(n_step=3, fragment_length=20)
    )
    worker = EnvWorkerActor(3, factory, shards, source, spec, exploration=0.2, seed=3)

    async def scenario():
        first = await worker.sample_into(1)
        synced = [await worker.sync_weights(), await worker.sync_weights()]
        both = await worker.sample_into([0, 1])
        ev = await worker.evaluate(1, seed=0, max_steps=30)
        out = first, synced, both, ev, await worker.stats()
        out += ([await s.stats() for s in shards],)
        await worker.close()
        return out

    first, synced, both, ev, stats, (s0, s1) = asyncio.run(scenario())
    assert (first.rollouts, first.steps, first.weights_version) == (1, 20, -1)
    assert synced == [7, None]  # the second ask finds nothing newer
    assert (both.rollouts, both.steps, both.weights_version) == (2, 40, 7)
    assert s0["replay/0/rollouts_stored"] == 1 and s1["replay/1/rollouts_stored"] == 2
    # every step is one transition but the n - 1 (or fewer) still pending; a fragment
    # holds those it completed: its own steps' and up to n - 1 carried over from the last
    pending = worker._worker.num_pending
    assert s0["replay/0/size"] + s1["replay/1/size"] == 60 - pending <= 60
    assert 20 - 2 <= s0["replay/0/size"] <= 20 + 2
    assert ev["weights_version"] == 7 and 1 <= ev["return_mean"] <= 30
    assert stats["env/epsilon/3"] == 0.2
    assert stats["env/3/rollouts_sent"] == 3 and stats["env/3/steps_sampled"] == 60
    assert stats["env/3/weights_version"] == 7


def test_prefetcher_waits_while_the_queue_is_full_and_drops_nothing():
    shards = [shard(0), shard(1)]
    inq: queue.Queue = queue.Queue(maxsize=4)
    alive = [True]  # the consumer (the learner thread), here this coroutine

    async def scenario():
        for k, s in enumerate(shards):
            await s.add(transitions(64, k))
        handles = [object(), object()]  # not the shards: both are called as local objects
        pf = ReplayPrefetcher(ShardLinks(shards, handles), inq, batch_size=8, prefetch_per_shard=2)
        pf.start(lambda: alive[0])
        await until(inq.full)  # the slots now wait for space
        taken = [inq.get_nowait() for _ in range(4)]
        for _ in taken:
            pf.taken(asyncio.get_running_loop())  # at half queue: the waiting slots wake
        await until(inq.full)
        alive[0] = False
        await pf.stop(timeout_s=5.0)
        return pf, taken

    pf, taken = asyncio.run(scenario())
    assert pf.local_shards == 2
    assert pf.enqueue_blocked_s > 0.0
    assert pf.batches_received == len(taken) + inq.qsize() == 8  # none beyond the queue
    assert pf.batches_lost == 0 and not pf.errors
    assert pf.added_total == 128
    assert {b.shard_id for b in taken} == {0, 1}


def test_prefetcher_keeps_batches_times_batch_size_within_the_replay_ratio():
    s = shard(0)
    inq: queue.Queue = queue.Queue(maxsize=100)

    async def scenario():
        await s.add(transitions(40, 5))  # ratio 2: at most 2 * 40 / 8 = 10 batches
        pf = ReplayPrefetcher(ShardLinks([s], [s]), inq, batch_size=8, max_replay_ratio=2.0)
        pf.start(lambda: True)
        # requests in flight count against the ratio too: once the gate holds, none can follow
        await until(lambda: pf.ratio_wait_s > 0.0 and inq.qsize() >= 10)
        capped, waited = inq.qsize(), pf.ratio_wait_s
        await s.add(transitions(20, 6))  # room for 5 more
        await until(lambda: inq.qsize() >= 15 and pf.ratio_wait_s > waited)
        await pf.stop(timeout_s=5.0)
        return pf, capped

    pf, capped = asyncio.run(scenario())
    assert pf.local_shards == 0  # its handle is itself: called as a remote shard
    assert capped == 10
    assert pf.batches_received == inq.qsize() == 15
    assert pf.ratio_wait_s > 0.0


def test_shard_links_call_local_shards_directly_and_follow_a_rebuilt_shard():
    local, rebuilt = object(), object()
    here = {"h0": local, "h2": rebuilt}  # the actors "on this worker", by handle
    links = ShardLinks([local, "h1"], ["h0", "h1"], resolve=lambda h: here.get(h, h))
    assert len(links) == 2 and links.local_count == 1
    assert links.is_local(0) and links.target(0) is local and links.handle(0) == "h0"
    assert not links.is_local(1) and links.target(1) == "h1"
    links.set_shard(1, "h2")  # shard 1 rebuilt on this worker
    assert links.is_local(1) and links.target(1) is rebuilt and links.local_count == 2
    links.set_shard(0, "h3")  # shard 0 rebuilt elsewhere: called through its handle
    assert not links.is_local(0) and links.target(0) == "h3" and links.handle(0) == "h3"


def test_a_shard_sample_is_the_replayed_batch_message_with_its_shard_id():
    from apex_dask.algo.replay.sample import ReplaySample

    s = shard(4, learning_starts=10)

    async def scenario():
        await s.add(transitions(30, 0))
        return await s.sample()

    batch = asyncio.run(scenario())
    assert type(batch) is ReplaySample and batch.generations.shape == (8,)
    assert batch.shard_id == 4 and batch.added == 30 and len(batch.indices) == 8


@pytest.mark.parametrize("pipeline", [False, True])
def test_learner_actor_hands_every_batchs_priorities_back_to_its_shard(pipeline):
    """The pipelined path (the one a CUDA learner takes) reads each update's results one
    update later; after ``stop()`` every trained batch's priorities reached its shard."""
    from apex_dask.runtime.actors import LearnerActor

    shards = [shard(0), shard(1)]
    spaces = probe_spaces(make_env_factory("CartPole-v1"))
    agent = AgentSpec("dqn", DQNConfig(hiddens=HIDDENS, pipeline=pipeline), CPU)

    async def scenario():
        for k, s in enumerate(shards):
            await s.add(transitions(64, k))
        learner = LearnerActor(*spaces, shards, agent=agent, batch_size=8)
        await learner.start()
        await until(lambda: learner.batches_trained >= 12)
        final = await learner.stop()
        version, _ = await learner.get_weights()
        applied = [
            (await s.stats())["replay/" + str(k) + "/priority_updates_applied"]
            for k, s in enumerate(shards)
        ]
        return final, version, applied

    final, version, applied = asyncio.run(scenario())
    trained = final["flow/batches_trained"]
    assert final["flow/batches_received"] == trained + final["flow/batches_in_queue"]
    assert final["flow/priority_updates_sent"] == trained == sum(applied) == version
    assert np.isfinite(final["learner/loss"])
    assert not any(k.startswith("learner/device") for k in final)  # CPU: absent, not zero


def test_prefetcher_reads_a_remote_shards_batches_from_shared_memory():
    """Shards called as remote actors (targets are the handles) answer ``sample_shared``;
    the batches are views into their slots, freed by ``release``."""
    shards = [shard(k, shared_slots=3, shared_wait_s=0.05) for k in range(2)]
    inq: queue.Queue = queue.Queue(maxsize=4)

    async def scenario():
        for k, s in enumerate(shards):
            await s.add(transitions(64, k))
        links = ShardLinks(shards, shards)  # not local: the shared-memory path
        pf = ReplayPrefetcher(links, inq, batch_size=8, prefetch_per_shard=2, shared_memory=True)
        pf.start(lambda: True)
        await until(inq.full)
        taken = [inq.get_nowait() for _ in range(4)]
        for b in taken:
            b.release()
            pf.taken(asyncio.get_running_loop())
        await until(inq.full)
        await pf.stop(timeout_s=0.5)  # the slots waiting on the full queue are cancelled
        stats = [await s.shared_stats() for s in shards]
        for s in shards:
            await s.close()
        pf.close()
        return pf, taken, stats

    pf, taken, stats = asyncio.run(scenario())
    # 3 slots a shard: past them, a shard waits shared_wait_s, then sends the batch whole
    whole = sum(s["no_slot"] for s in stats)
    assert pf.batches_received == pf.shared_batches + whole and pf.batches_lost == 0
    assert pf.shared_batches >= 6
    assert all(b.data["obs"].shape == (8, 4) for b in taken)
    assert sum(b.lease is not None for b in taken) >= 3
    assert {b.shard_id for b in taken} == {0, 1}
    assert sum(s["written"] for s in stats) == pf.shared_batches
    assert not pf.errors


def test_calls_waiting_on_a_replaced_peer_end_at_once_and_read_as_a_lost_peer():
    from apex_dask.runtime.actors.calls import PeerCalls, PeerReplaced, peer_lost

    async def scenario() -> tuple[BaseException, float, int]:
        calls = PeerCalls()
        never = asyncio.get_running_loop().create_future()  # a dead actor never answers
        waiting = asyncio.ensure_future(calls.call(("shard", 0), never, timeout_s=60.0))
        other = asyncio.ensure_future(calls.call(("shard", 1), asyncio.sleep(0.2, 7), 60.0))
        await asyncio.sleep(0.05)
        assert calls.in_flight(("shard", 0)) == 1
        t0 = time.monotonic()
        ended = calls.replaced(("shard", 0))
        try:
            await waiting
        except BaseException as exc:  # noqa: BLE001
            return exc, time.monotonic() - t0, ended + await other
        raise AssertionError("the call did not end")

    exc, took, both = asyncio.run(scenario())
    assert isinstance(exc, PeerReplaced) and peer_lost(exc)
    assert took < 1.0 and both == 1 + 7  # one call ended; the other peer's call unaffected


@pytest.mark.parametrize("named", [False, True], ids=["requests-only", "driver-named"])
def test_a_relay_serves_a_rebuilt_learner_at_once_while_asks_of_the_lost_one_wait(named):
    """The chaos matrix's row 2 once waited 60 s for a greedy evaluation after the learner
    was killed: the relay's ask of the lost learner held it, and requests naming the
    rebuilt learner queued behind (then behind requests still naming the lost one)."""
    from apex_dask.runtime.actors.weight_relay import StaleLearner, WeightRelayActor

    weights = {"w": np.arange(3, dtype=np.float32)}

    async def scenario():
        relay = WeightRelayActor("h", call_timeout_s=60.0)
        lost, new = LostLearner(), WeightsSource(7, weights)
        old = [asyncio.ensure_future(relay.weights_if_newer(-1, lost)) for _ in range(3)]
        await until(lambda: lost.asked == 1)  # one ask, two requests queued behind it
        t0 = time.monotonic()
        if named:  # the driver's recovery tells the relays before the env workers
            await relay.set_learner(new, lost=True)
        got = await asyncio.wait_for(relay.weights_if_newer(-1, new), 10.0)
        took = time.monotonic() - t0
        ends = await asyncio.gather(*old, return_exceptions=True)
        late = await asyncio.gather(relay.weights_if_newer(-1, lost), return_exceptions=True)
        again = await relay.weights_if_newer(7, new)
        return got, took, ends, late, again, await relay.stats(), lost.asked, new.asked

    got, took, ends, late, again, stats, lost_asks, new_asks = asyncio.run(scenario())
    assert pickle.loads(got)[0] == 7
    np.testing.assert_array_equal(pickle.loads(got)[1]["w"], weights["w"])
    assert took < 5.0, f"the rebuilt learner's weights came {took:.1f} s later"
    # the lost learner's requests failed (their env workers pull from the learner they
    # follow); one ask only reached it, and a late request for it fails at once
    assert all(isinstance(e, ConnectionError) for e in ends), ends
    assert isinstance(late[0], StaleLearner) and lost_asks == 1
    assert again is None and new_asks == 2  # nothing newer than 7
    p = "relay/h/"
    assert stats[p + "requests"] == 6
    assert stats[p + "served"] == 1 and stats[p + "current"] == 1
    assert stats[p + "failed"] == 4 and stats[p + "in_flight"] == 0
    assert stats[p + "version"] == 7
