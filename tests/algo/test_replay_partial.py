"""A shard's state with only its newest items (a checkpoint that must fit in a stop's grace).

``ReplayShard.state_dict(max_items=m)`` must load, unchanged, into a shard that
then holds exactly the newest ``m`` items (with frame stacks: their frames),
each with its priority, the whole shard's counters, and that goes on adding
and sampling as a shard that had only ever kept those items.
"""

from __future__ import annotations

import numpy as np
import pytest
from frame_rollouts import StackedEpisodes, naive_sample_check
from test_replay import transitions
from test_replay_frames import add_both

from apex_dask.algo.replay.codec import encode_batch
from apex_dask.algo.replay.shard import ReplayShard


def through_npz(state: dict, path) -> dict:
    np.savez(path, **state)
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def priorities_of(shard: ReplayShard, slots: np.ndarray) -> np.ndarray:
    """The priority stored at ``slots`` (read through the full state, the format's keys)."""
    return np.asarray(shard.state_dict()["priority"])[slots]


@pytest.mark.parametrize("keep", [0, 1, 30, 99])
def test_the_newest_items_come_back_with_their_priorities_and_the_shards_counters(keep, tmp_path):
    rng = np.random.default_rng(keep)
    a = ReplayShard(100, alpha=0.7, seed=3)
    start = 0
    for n in (40, 70, 55, 85):  # wraps the ring twice
        a.add(transitions(n, start), rng.exponential(size=n))
        start += n
        s = a.sample(32, beta=0.4)
        a.update_priorities(s.indices, rng.exponential(size=32))
    state = a.state_dict(max_items=keep)
    assert all(len(state[k]) == keep for k in state if k.startswith("data/"))  # only they
    b = ReplayShard(100, alpha=0.7, seed=0)
    b.load_state_dict(through_npz(state, tmp_path / "part.npz"))

    assert len(b) == keep
    newest = a.stored_slots()[:keep]
    got, want = b.items_at(b.stored_slots()), a.items_at(newest)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    np.testing.assert_array_equal(priorities_of(b, b.stored_slots()), priorities_of(a, newest))
    sa, sb = a.stats(), b.stats()
    for key in ("added", "sampled", "updated", "max_priority"):
        assert sb[key] == sa[key], key
    assert sb["evicted"] == sa["added"] - keep  # the items left out count as evicted

    # It goes on as a shard holding only those items: the next adds follow them.
    b.add(transitions(20, start), np.full(20, 0.5))
    assert len(b) == min(100, keep + 20)
    items = b.items_at(b.stored_slots())["action"]  # newest first
    np.testing.assert_array_equal(items[:20], np.arange(start + 19, start - 1, -1))
    np.testing.assert_array_equal(items[20:], want["action"][: len(items) - 20])
    if len(b) > 0:
        s = b.sample(64, beta=0.4)
        assert set(s.data["action"].tolist()) <= set(items.tolist())
        # the restored items' generations name them: an update to what was sampled lands
        assert b.update_priorities(s.indices, np.full(64, 7.0), s.generations) == 0
        np.testing.assert_array_equal(priorities_of(b, s.indices), np.full(64, 7.0))


def test_a_frame_stacked_shard_keeps_the_frames_of_its_newest_items_and_continues(tmp_path):
    rng = np.random.default_rng(11)
    producers = [StackedEpisodes(rng, lengths=(1, 30), frame_shape=(8, 8)) for _ in range(2)]
    a = ReplayShard(150, seed=2, frame_stack=4)
    naive_a: dict[int, dict] = {}
    for i in range(40):  # wraps the item and the frame rings
        batch = producers[i % 2].fragment(int(rng.integers(5, 50)))
        add_both(
            a, naive_a, batch, 4, compact=True, priorities=rng.exponential(size=len(batch["obs"]))
        )
    keep = 57
    state = a.state_dict(max_items=keep)
    full = a.state_dict()
    assert len(state["frames/data"]) < len(full["frames/data"])  # only the frames they use
    b = ReplayShard(150, seed=2, frame_stack=4)
    b.load_state_dict(through_npz(state, tmp_path / "part.npz"))

    assert len(b) == keep
    newest = a.stored_slots()[:keep]
    np.testing.assert_array_equal(priorities_of(b, b.stored_slots()), priorities_of(a, newest))
    # b's slot of each kept item -> the item, as the producers made it
    naive_b = {int(sb): naive_a[int(sa)] for sb, sa in zip(b.stored_slots(), newest, strict=True)}
    got = b.items_at(b.stored_slots())
    for j, slot in enumerate(b.stored_slots()):
        for key in ("obs", "next_obs", "action"):
            np.testing.assert_array_equal(got[key][j], naive_b[int(slot)][key], err_msg=key)
    assert b.stats()["added"] == a.stats()["added"]

    # Adding on wraps both rings again; every item sampled is still the one stored.
    for i in range(40):
        batch = producers[i % 2].fragment(int(rng.integers(5, 50)))
        add_both(b, naive_b, batch, 4, compact=bool(i % 2))
        naive_sample_check(b, naive_b, 64)
    live = b.stored_slots()
    data = b.items_at(live)
    for j, slot in enumerate(live):
        np.testing.assert_array_equal(data["obs"][j], naive_b[int(slot)]["obs"])


def test_max_items_at_or_above_the_size_is_the_full_state():
    a = ReplayShard(50, seed=1)
    a.add(transitions(30))
    full = a.state_dict()
    for m in (30, 31, None):
        same = a.state_dict(max_items=m)
        assert same.keys() == full.keys()
        for k in full:
            np.testing.assert_array_equal(same[k], full[k], err_msg=k)


def test_a_batch_after_a_partial_restore_leaves_the_kept_items_frames_alone(tmp_path):
    # The frame ids continue where they were: a batch added after the restore is written
    # after the kept items' frames, not over them (the ring has room for both here).
    rng = np.random.default_rng(3)
    env = StackedEpisodes(rng, lengths=(10, 20), frame_shape=(4, 4))
    a = ReplayShard(200, seed=0, frame_stack=4)
    for _ in range(6):
        a.add(encode_batch(env.fragment(30), 4))
    b = ReplayShard(200, seed=0, frame_stack=4)
    b.load_state_dict(through_npz(a.state_dict(max_items=10), tmp_path / "p.npz"))
    kept = b.items_at(b.stored_slots())
    added = len(b.add(encode_batch(env.fragment(25), 4)))
    assert len(b) == 10 + added
    still = b.items_at(b.stored_slots())
    for key in ("obs", "next_obs"):
        np.testing.assert_array_equal(still[key][added:], kept[key])
