"""A priority update never lands on an item it was not computed for, across rebuilds and
restores of a shard.

Each sampled item carries its slot's generation. A shard rebuilt after a fault
holds fewer items than the one sampled (restored from an older checkpoint, or
empty); it is restored again from the same checkpoint, or from one older than a
hand-over. In each case the late update is stale (skipped, counted), never an
error and never applied to the item that now sits at that slot.
"""

from __future__ import annotations

import numpy as np
import pytest

from apex_dask.algo.replay.shard import ReplayShard

CAPACITY = 64


def transitions(n: int, start: int) -> dict[str, np.ndarray]:
    """n transitions whose fields encode the item numbers start..start+n-1."""
    i = np.arange(start, start + n)
    return {
        "obs": np.repeat(i[:, None], 3, axis=1).astype(np.float32),
        "action": i.astype(np.int64),
        "reward": i.astype(np.float32),
        "next_obs": np.repeat(i[:, None] + 1, 3, axis=1).astype(np.float32),
        "done": np.zeros(n, bool),
    }


def shard() -> ReplayShard:
    return ReplayShard(CAPACITY, alpha=1.0, eps=1e-6, seed=0, backend="numpy")


def priorities_of(s: ReplayShard, slots: np.ndarray) -> np.ndarray:
    """The priorities the shard holds for ``slots``, read through its checkpoint state."""
    state = s.state_dict()
    return np.asarray(state["priority"])[slots]


def new_items_sample(s: ReplayShard, first_slot: int, n: int):
    """A sample of exactly the ``n`` items written at slots ``first_slot..``: they are given
    all the priority mass, so a large batch draws each of them."""
    slots = (first_slot + np.arange(n)) % CAPACITY
    p = np.zeros(len(s), np.float32) if len(s) == s.capacity else None
    assert p is not None  # the ring is full in these tests: every slot is an item
    p[slots] = 1.0
    s.update_priorities(np.arange(len(s)), p)
    sample = s.sample(4096, beta=0.4)
    assert set(sample.indices.tolist()) == set(slots.tolist())
    return sample


def test_an_update_to_slots_a_rebuilt_shard_never_held_is_stale_not_an_error():
    old = shard()
    old.add(transitions(50, 0))
    sample = old.sample(32, beta=0.4)  # slots up to 49
    assert sample.indices.max() >= 3
    rebuilt = shard()
    rebuilt.add(transitions(3, 1000))  # a rebuilt shard: 3 items
    stale = rebuilt.update_priorities(sample.indices, np.full(32, 50.0), sample.generations)
    # items it holds have other generations: every update is stale; nothing raised
    assert stale == 32
    assert rebuilt.stats()["stale_priority_updates"] == 32
    assert not np.any(priorities_of(rebuilt, np.arange(3)) == 50.0)
    # the shard goes on: an update for its own items lands
    own = rebuilt.sample(8, beta=0.4)
    assert rebuilt.update_priorities(own.indices, np.full(8, 7.0), own.generations) == 0
    assert np.all(priorities_of(rebuilt, own.indices) == 7.0)


def test_indices_outside_the_ring_are_still_refused():
    s = shard()
    s.add(transitions(10, 0))
    with pytest.raises(ValueError, match="indices must lie in"):
        s.update_priorities(np.array([CAPACITY]), np.ones(1), np.ones(1, np.int64))
    with pytest.raises(ValueError, match="indices must lie in"):
        s.update_priorities(np.array([-1]), np.ones(1), np.ones(1, np.int64))
    with pytest.raises(ValueError, match="indices must lie in"):  # no generations: held only
        s.update_priorities(np.array([20]), np.ones(1))


def test_restoring_the_same_checkpoint_twice_never_gives_an_old_update_a_new_item():
    first = shard()
    first.add(transitions(CAPACITY, 0))  # the ring is full
    checkpoint = first.state_dict()
    a = shard()
    a.load_state_dict(checkpoint)
    pos = int(a.state_dict()["pos"])
    a.add(transitions(8, 500))  # items written after the first restore
    late = new_items_sample(a, pos, 8)  # the learner holds this sample's update
    b = shard()
    b.load_state_dict(checkpoint)  # the same checkpoint again (a second rebuild)
    b.add(transitions(8, 900))  # other items, written at the same slots
    stale = b.update_priorities(late.indices, np.full(len(late.indices), 50.0), late.generations)
    assert stale == len(late.indices)  # none of them lands on b's new items
    slots = (pos + np.arange(8)) % CAPACITY
    assert not np.any(priorities_of(b, slots) == 50.0)
    assert b.stats()["stale_priority_updates"] == len(late.indices)


def test_a_restore_older_than_a_hand_over_never_gives_an_old_update_a_new_item():
    old = shard()
    old.add(transitions(CAPACITY, 0))
    checkpoint = old.state_dict()  # the run's newest checkpoint
    moved = shard()
    moved.load_state_dict(old.state_dict())  # handed over (the old worker retires)
    pos = int(moved.state_dict()["pos"])
    moved.add(transitions(8, 500))
    late = new_items_sample(moved, pos, 8)
    rebuilt = shard()  # the moved shard's worker is lost: rebuilt from the checkpoint
    rebuilt.load_state_dict(checkpoint)
    rebuilt.add(transitions(8, 900))
    stale = rebuilt.update_priorities(
        late.indices, np.full(len(late.indices), 50.0), late.generations
    )
    assert stale == len(late.indices)
    assert not np.any(priorities_of(rebuilt, (pos + np.arange(8)) % CAPACITY) == 50.0)


def test_items_restored_keep_their_generation_so_their_updates_still_land():
    first = shard()
    first.add(transitions(CAPACITY, 0))
    sample = first.sample(16, beta=0.4)
    restored = shard()
    restored.load_state_dict(first.state_dict())
    assert restored.update_priorities(sample.indices, np.full(16, 9.0), sample.generations) == 0
    assert np.all(priorities_of(restored, sample.indices) == 9.0)
