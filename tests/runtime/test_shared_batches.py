"""Sampled batches through shared memory: a writer's slots, a reader's views, releases."""

from __future__ import annotations

import numpy as np
import pytest
from agent_parts import CPU
from gymnasium import spaces

from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.learner import Learner
from apex_dask.algo.replay.sample import ReplaySample
from apex_dask.runtime.actors.shared_batches import SharedBatchReader, SharedBatchWriter

OBS = spaces.Box(0, 255, (4, 10, 10), np.uint8)
ACT = spaces.Discrete(6)


def sample(rng: np.random.Generator, n: int = 16, shard_id: int = 2) -> ReplaySample:
    data = {
        "obs": rng.integers(0, 256, (n, 4, 10, 10), dtype=np.uint8),
        "next_obs": rng.integers(0, 256, (n, 4, 10, 10), dtype=np.uint8),
        "action": rng.integers(0, 6, n),
        "reward": rng.normal(size=n).astype(np.float32),
        "discount": np.full(n, 0.97, np.float32),
    }
    return ReplaySample(
        rng.integers(0, 1000, n),
        rng.random(n).astype(np.float32),
        data,
        rng.integers(1, 10**12, n),
        shard_id,
        77,
    )


@pytest.fixture
def pair():
    writer, reader = SharedBatchWriter(slots=3, prefix="apextest"), SharedBatchReader()
    yield writer, reader
    reader.close()
    writer.close()


def same(a: ReplaySample, b: ReplaySample) -> bool:
    return (
        np.array_equal(a.indices, b.indices)
        and np.array_equal(a.weights, b.weights)
        and np.array_equal(a.generations, b.generations)
        and a.data.keys() == b.data.keys()
        and all(
            np.array_equal(a.data[k], b.data[k]) and a.data[k].dtype == b.data[k].dtype
            for k in a.data
        )
        and (a.shard_id, a.added) == (b.shard_id, b.added)
    )


def test_a_batch_reads_back_in_place_identical_to_what_was_written(pair):
    writer, reader = pair
    s = sample(np.random.default_rng(0))
    ref = writer.write(s)
    assert ref is not None and ref.block == writer.block
    got = reader.open(ref)
    assert same(got, s)
    assert not got.data["obs"].flags.owndata  # a view into the slot, not a copy
    assert got.data["obs"].ctypes.data % 64 == 0


def test_slots_are_held_until_released_then_reused(pair):
    writer, reader = pair
    rng = np.random.default_rng(1)
    batches = [sample(rng) for _ in range(4)]
    refs = [writer.write(b) for b in batches[:3]]
    assert writer.free_slots() == 0
    assert writer.write(batches[3]) is None and writer.no_slot == 1  # send it whole instead
    opened = [reader.open(r) for r in refs]
    assert all(same(o, b) for o, b in zip(opened, batches[:3], strict=True))
    opened[1].release()
    opened[1].release()  # twice is once
    assert writer.free_slots() == 1 and reader.released == 1
    ref = writer.write(batches[3])
    assert ref is not None and ref.slot == refs[1].slot
    assert same(reader.open(ref), batches[3]) and same(opened[0], batches[0])  # others intact


def test_a_new_reader_frees_the_slots_a_lost_one_held(pair):
    writer, reader = pair
    rng = np.random.default_rng(2)
    writer.reader_is(reader.id)
    for _ in range(3):
        writer.write(sample(rng))
    assert writer.free_slots() == 0
    writer.reader_is("another learner")
    assert writer.free_slots() == 3


def test_another_batch_shape_gets_a_new_block_and_the_old_one_is_unlinked(pair):
    writer, reader = pair
    rng = np.random.default_rng(3)
    first = writer.write(sample(rng, n=16))
    second = writer.write(sample(rng, n=8))
    assert first.block != second.block
    with pytest.raises(FileNotFoundError):
        reader.open(first)
    assert reader.open(second).indices.shape == (8,)


def test_no_room_in_shared_memory_means_the_batch_travels_whole():
    writer = SharedBatchWriter(slots=2, min_free_bytes=1 << 62)
    try:
        assert writer.write(sample(np.random.default_rng(4))) is None
        assert "shared memory" in writer.error
    finally:
        writer.close()


def test_a_plain_sample_release_is_a_no_op():
    s = sample(np.random.default_rng(5))
    s.release()
    assert s.with_shard_id(1).lease is None


def test_a_priority_update_made_after_the_release_carries_the_samples_own_items():
    """The learner's order: train on the slot, release it, then hand the priorities back.
    The shard may write its next batch into the freed slot before the update is built or
    sent; the update must still name the items that were trained on."""
    writer, reader = SharedBatchWriter(slots=1, prefix="apextest"), SharedBatchReader()
    try:
        rng = np.random.default_rng(3)
        first, second = sample(rng), sample(rng)
        got = reader.open(writer.write(first))
        trained_on = {k: v.copy() for k, v in got.data.items()}  # what update() read
        got.release()
        assert writer.write(second) is not None  # the same slot, rewritten at once
        update = got.priority_update(np.arange(16, dtype=np.float32))
        np.testing.assert_array_equal(update.indices, first.indices)
        np.testing.assert_array_equal(update.generations, first.generations)
        for k, v in trained_on.items():
            np.testing.assert_array_equal(v, first.data[k])
        assert (update.shard_id, update.checksums) == (first.shard_id, None)
    finally:
        reader.close()
        writer.close()


def test_pipelined_priorities_read_a_whole_update_after_the_release_name_their_own_items():
    """The pipelined path hands update k's priorities back after batch k's shared-memory
    slot was released and refilled with batch k+1: they must still name batch k's items."""
    rng = np.random.default_rng(5)
    writer, reader = SharedBatchWriter(slots=1, prefix="apextest"), SharedBatchReader()
    lr, sent = Learner(OBS, ACT, DQNConfig(hiddens=(16,), pipeline=True), CPU), []
    try:
        samples = []
        for _ in range(4):
            samples.append(sample(rng, n=8))
            batch = reader.open(writer.write(samples[-1]))  # the one slot, rewritten each time
            done = lr.submit(batch.data, batch.weights, tag=batch)
            batch.release()
            sent += [d.tag.priority_update(d.td_abs) for d in done]
        sent += [d.tag.priority_update(d.td_abs) for d in lr.drain()]
    finally:
        reader.close()
        writer.close()
    assert len(sent) == 4
    for update, trained in zip(sent, samples, strict=True):
        np.testing.assert_array_equal(update.indices, trained.indices)
        np.testing.assert_array_equal(update.generations, trained.generations)
